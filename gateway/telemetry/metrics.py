"""Prometheus metrics of the gateway: one ``prometheus_client`` registry per app, no global state.

Recording is plain ``prometheus_client`` (~1-2 µs per observation; the OpenTelemetry SDK's
instruments cost ~8-14 µs each, see ``loadtests/bench_telemetry.py``); OpenTelemetry gets the
same numbers for OTLP export by reading this registry (``gateway.telemetry.otlp_metrics``), so
``/metrics`` and OTLP never disagree and the request path pays once.

Names follow the OpenTelemetry GenAI semantic conventions where they exist, translated to
Prometheus the way OpenTelemetry's Prometheus exporter does (dots to ``_``, unit suffix):

- ``gen_ai_server_request_duration_seconds`` (``gen_ai.server.request.duration``): arrival to
  last byte, every request;
- ``gen_ai_server_time_to_first_token_seconds`` (``gen_ai.server.time_to_first_token``):
  upstream request sent to first content event, streams that delivered one;
- ``gen_ai_server_time_per_output_token_seconds`` (``gen_ai.server.time_per_output_token``):
  (last event − first event) / (output tokens − 1), successful streams;
- ``gen_ai_client_token_usage`` (``gen_ai.client.token.usage``, unit ``{token}``) with
  ``gen_ai_token_type`` = ``input`` (all prompt tokens, cached included), ``output``, and
  ``cached_input`` (the cached part of ``input``: do not add it to ``input``);
- ``gen_ai_client_operation_time_per_output_chunk_seconds``
  (``gen_ai.client.operation.time_per_output_chunk``): the inter-token latency (ITL), every gap
  between two consecutive content events of a stream (the gateway is the engine's client; a
  chunk is one token on a standard pool, often several with speculative decoding).

GenAI metrics carry ``gen_ai_operation_name`` (``chat`` for chat completions, Responses and
Anthropic Messages, ``text_completion``, ``count_tokens``),
``gen_ai_request_model``, ``tier`` and ``pool``; gateway metrics (``speedgate_*``) carry
``model``, ``tier``, ``pool`` and their own reason labels. ``tier`` is the tier that served, or
the tier asked for when none did; ``pool`` is ``model/tier`` of the serving pool ("" when none).
Labels never carry an API key, a session id or a URL credential (replica URLs are redacted).

Bucket boundaries: the semantic conventions' advice, extended to the minutes an LLM request
can take (long prefills, 1-hour deadlines) and, for per-token times, down to the millisecond
of a speculative-decoding fast tier.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from gateway.telemetry.histograms import (
    DURATION_BUCKETS,
    ITL_BUCKETS,
    QUEUE_BUCKETS,
    RATIO_BUCKETS,
    TOKEN_BUCKETS,
    TPOT_BUCKETS,
    TTFT_BUCKETS,
    BulkHistogram,
)

if TYPE_CHECKING:
    from gateway.fleet.pools import Pool, PoolRegistry
    from gateway.telemetry.record import RequestRecord

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

GENAI_LABELS = ("gen_ai_operation_name", "gen_ai_request_model", "tier", "pool")


def _now() -> float:
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()


class _PoolCollector(Collector):
    """Scrape-time metrics from the live pool state (no work on the request path)."""

    def __init__(self, pools: PoolRegistry) -> None:
        self.pools = pools

    def collect(self) -> Iterator[Metric]:
        labels = ["pool", "replica"]
        inflight = GaugeMetricFamily(
            "speedgate_replica_inflight",
            "Requests this gateway has open to the replica",
            labels=labels,
        )
        healthy = GaugeMetricFamily(
            "speedgate_replica_healthy",
            "1 when the replica passes its active health probes",
            labels=labels,
        )
        ejected = GaugeMetricFamily(
            "speedgate_replica_ejected",
            "1 while outlier detection has ejected the replica",
            labels=labels,
        )
        ejections = CounterMetricFamily(
            "speedgate_replica_ejections", "Outlier ejections of the replica", labels=labels
        )
        exhausted = CounterMetricFamily(
            "speedgate_retry_budget_exhausted",
            "Retries refused because the pool's retry budget was spent",
            labels=["pool"],
        )
        now = _now()
        for pool in self.pools.all():
            for r in pool.replicas:
                key = [r.pool_key, r.safe_url]
                inflight.add_metric(key, r.inflight)
                healthy.add_metric(key, 1.0 if r.healthy else 0.0)
                ejected.add_metric(key, 1.0 if r.outlier.is_ejected(now) else 0.0)
                ejections.add_metric(key, r.outlier.ejections_total)
            exhausted.add_metric([pool.key], pool.budget.exhausted)
        yield from (inflight, healthy, ejected, ejections, exhausted)


class GatewayMetrics:
    """The gateway's metrics. At request end call ``record_request(rec)`` (``observe`` is the
    same); during the request ``record_attempt``/``record_retry``/``record_fallback``/
    ``record_timeout``. Replica load, health, ejections and retry-budget exhaustion are read
    from the pools at scrape time."""

    def __init__(self, pools: PoolRegistry) -> None:
        self.registry = r = CollectorRegistry()
        # labelled children by (metric, label values): ``labels()`` validates and locks on
        # every call (~1.5 µs); a request records ~8 series
        self._children: dict[tuple[Any, ...], Any] = {}
        g = GENAI_LABELS
        self.requests = Counter(
            "speedgate_requests",
            "Finished requests by model, tier, outcome and HTTP status",
            ["model", "tier", "outcome", "status"],
            registry=r,
        )
        self.request_duration = Histogram(
            "gen_ai_server_request_duration_seconds",
            "Request duration at the gateway, arrival to last byte",
            [*g, "outcome"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "gen_ai_server_time_to_first_token_seconds",
            "Upstream request sent to first content event (streams)",
            g,
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "gen_ai_server_time_per_output_token_seconds",
            "Decode time per output token after the first (successful streams)",
            g,
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self.token_usage = Histogram(
            "gen_ai_client_token_usage",
            "Tokens per request by gen_ai_token_type: input (cached included), output, "
            "cached_input",
            [*g, "gen_ai_token_type"],
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.itl = BulkHistogram(
            "gen_ai_client_operation_time_per_output_chunk_seconds",
            "Inter-token latency: gap between consecutive content events of a stream",
            g,
            ITL_BUCKETS,
            registry=r,
        )
        self.cost = Counter(
            "speedgate_cost_usd",
            "Cost of served requests in USD",
            ["model", "tier", "pool"],
            registry=r,
        )
        self.usage_estimated = Counter(
            "speedgate_usage_estimated",
            "Requests whose token usage was counted by the gateway (engine reported none)",
            ["model", "tier", "pool"],
            registry=r,
        )
        self.queue = Histogram(
            "speedgate_queue_time_seconds",
            "Arrival at the gateway to the first upstream attempt",
            ["model", "tier"],
            buckets=QUEUE_BUCKETS,
            registry=r,
        )
        self.attempts = Counter(
            "speedgate_upstream_attempts",
            "Upstream attempts by result (ok or the failure reason)",
            ["model", "tier", "pool", "result"],
            registry=r,
        )
        self.retries = Counter(
            "speedgate_retries",
            "Retries by the reason of the failure retried",
            ["model", "tier", "pool", "reason"],
            registry=r,
        )
        self.fallbacks = Counter(
            "speedgate_fallbacks",
            "Requests that moved on to the next tier of the fallback chain",
            ["model", "from_tier", "to_tier"],
            registry=r,
        )
        self.resumes = Counter(
            "speedgate_resumes",
            "Streams broken after content reached the client, by how they broke (reason) and "
            "what followed (resumed, refused: a documented rule forbids it, failed: no replica "
            "could continue it, completed: every choice had finished, the gateway ended it)",
            ["pool", "reason", "outcome"],
            registry=r,
        )
        self.timeouts = Counter(
            "speedgate_timeouts",
            "Upstream timeouts by stage (connect, ttft, stall, total)",
            ["model", "tier", "pool", "stage"],
            registry=r,
        )
        self.auto_estimate_ratio = Histogram(
            "speedgate_auto_estimate_ratio",
            "auto requests: measured / estimated upstream time (TTFT + decode) on the pool "
            "that served (decisions by reason and live estimates: speedgate_auto_*)",
            ["pool"],
            buckets=RATIO_BUCKETS,
            registry=r,
        )
        r.register(_PoolCollector(pools))

    def _child(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)``, cached (no series is ever removed from these)."""
        key = (metric, *values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def record_request(self, rec: RequestRecord) -> None:
        """Record one finished request (once, at the end, on every exit path). Reads ``model``,
        ``asked_tier``/``served_tier``, ``outcome``, ``status``, ``stream``, ``usage``,
        ``usage_estimated``, ``cost_usd``, ``ttft_s``, ``e2e_s``, ``queue_s`` and ``itl``."""
        model = rec.model or ""
        served = rec.served_tier
        tier = served or rec.asked_tier or ""
        pool = f"{model}/{served}" if served else ""
        outcome = rec.outcome or ""
        self._child(self.requests, model, tier, outcome, str(rec.status)).inc()
        g = (rec.operation, model, tier, pool)
        if rec.e2e_s is not None:
            self._child(self.request_duration, *g, outcome).observe(rec.e2e_s)
        if rec.queue_s is not None:
            self._child(self.queue, model, tier).observe(rec.queue_s)
        if not served:
            return
        if rec.stream and rec.ttft_s is not None:
            self._child(self.ttft, *g).observe(rec.ttft_s)
        u = rec.usage
        if u is not None:
            self._child(self.token_usage, *g, "input").observe(u.prompt)
            self._child(self.token_usage, *g, "output").observe(u.completion)
            self._child(self.token_usage, *g, "cached_input").observe(u.cached)
            if rec.usage_estimated:
                self._child(self.usage_estimated, model, tier, pool).inc()
        itl = rec.itl
        if itl is not None and itl.n:
            self._child(self.itl, *g).merge(itl)
        if outcome == "ok" and rec.stream and u is not None and u.completion > 1:
            decode_s = itl.span_s if itl is not None and itl.n else None
            if decode_s is None and rec.e2e_s is not None and rec.ttft_s is not None:
                decode_s = max(0.0, rec.e2e_s - rec.ttft_s - (rec.queue_s or 0.0))
            if decode_s is not None:
                self._child(self.tpot, *g).observe(decode_s / (u.completion - 1))
        if rec.cost_usd:
            self._child(self.cost, model, tier, pool).inc(rec.cost_usd)
        choice = rec.auto_choice
        expected = getattr(choice, "expected_s", None)
        if expected and outcome == "ok" and rec.ttft_s is not None and choice.pool_key == pool:
            span = itl.span_s if rec.stream and itl is not None else 0.0
            self._child(self.auto_estimate_ratio, pool).observe((rec.ttft_s + span) / expected)

    def observe(self, rec: RequestRecord) -> None:
        """Alias of ``record_request`` (the foundation's name)."""
        self.record_request(rec)

    def record_attempt(self, pool: Pool, result: str) -> None:
        """One upstream attempt on ``pool`` ended: ``ok`` or a failure slug (``connect-error``,
        ``http-503``, ``ttft-timeout``, ``client-error``...)."""
        self._child(self.attempts, pool.model, pool.tier, pool.key, result).inc()

    def record_retry(self, pool: Pool, reason: str) -> None:
        """A retry on ``pool`` is about to start because of ``reason`` (the failure slug)."""
        self.retries.labels(pool.model, pool.tier, pool.key, reason).inc()

    def record_fallback(self, model: str, from_tier: str, to_tier: str) -> None:
        """The request moves from ``from_tier``'s pool to ``to_tier``'s."""
        self.fallbacks.labels(model, from_tier, to_tier).inc()

    def record_resume(self, pool: Pool, reason: str, outcome: str) -> None:
        """A stream of ``pool`` broke mid-way (``reason``: broken-stream, eof, stall-timeout,
        malformed, engine-error); ``outcome``: resumed | refused | failed | completed."""
        self.resumes.labels(pool.key, reason, outcome).inc()

    def record_timeout(self, pool: Pool, stage: str) -> None:
        """An upstream timeout on ``pool`` at ``stage`` (connect, ttft, stall, total)."""
        self.timeouts.labels(pool.model, pool.tier, pool.key, stage).inc()

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)

    async def render_async(self) -> bytes:
        """``render()`` in a worker thread: prometheus_client formats ~100 samples per ms, so
        a scrape of a busy gateway (~1,000 series) would block the event loop for ~10 ms."""
        return await asyncio.to_thread(self.render)

    def sample_names(self) -> set[str]:
        """Every sample name the registry exports now (``..._bucket``, ``..._total``...)."""
        return {s.name for fam in self.registry.collect() for s in fam.samples}


def metric_label_names(registry: CollectorRegistry) -> dict[str, set[str]]:
    """Label names per exported sample name (for checks of dashboards and docs)."""
    out: dict[str, set[str]] = {}
    for fam in registry.collect():
        for s in fam.samples:
            out.setdefault(s.name, set()).update(s.labels)
    return out
