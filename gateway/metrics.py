"""Prometheus metrics of the gateway: one ``prometheus_client`` registry per app, no global state.

Recording is plain ``prometheus_client`` (~1-2 µs per observation; the OpenTelemetry SDK's
instruments cost ~8-14 µs each, see ``loadtests/bench_telemetry.py``); OpenTelemetry gets the
same numbers for OTLP export by reading this registry (``gateway.otlp_metrics``), so ``/metrics``
and OTLP never disagree and the request path pays once.

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

GenAI metrics carry ``gen_ai_operation_name`` (``chat``/``text_completion``),
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
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from itertools import accumulate
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

if TYPE_CHECKING:
    from gateway.access import RequestRecord
    from gateway.pools import Pool, PoolRegistry

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Seconds. Semconv advice for TTFT ends at 10 s; prefill of a long agent context can take
# minutes (the default ttft timeout is 300 s).
TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip
# Seconds per token. Semconv advice starts at 10 ms; a speculative-decoding tier goes below.
TPOT_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
    0.5, 0.75, 1.0, 2.5,
)  # fmt: skip
# Seconds. Semconv advice (doubling from 10 ms to 82 s) continued to ~44 min.
DURATION_BUCKETS: tuple[float, ...] = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96,
    81.92, 163.84, 327.68, 655.36, 1310.72, 2621.44,
)  # fmt: skip
# Seconds between two content events of a stream.
ITL_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
# Seconds from arrival to the first upstream attempt (body read, parse, plan, routing).
QUEUE_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
# Measured / estimated upstream time of auto requests (1 = the estimate was exact).
RATIO_BUCKETS: tuple[float, ...] = (0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0)
# Tokens: the semconv advice for gen_ai.client.token.usage (powers of 4).
TOKEN_BUCKETS: tuple[float, ...] = tuple(float(4**i) for i in range(14))

GENAI_LABELS = ("gen_ai_operation_name", "gen_ai_request_model", "tier", "pool")


class GapTimer:
    """Gaps between consecutive content events of one stream, bucketed as they come.

    ``tick(now)`` per event (monotonic seconds; ~0.2 µs, no allocation); the request's
    ``RequestRecord.itl`` holds it and ``GatewayMetrics.record_request`` merges it into the ITL
    histogram in one step. ``span_s`` (last event − first event) is the decode time.
    """

    __slots__ = ("counts", "first", "last", "n", "sum_s")

    def __init__(self) -> None:
        self.counts = [0] * (len(ITL_BUCKETS) + 1)
        self.sum_s = 0.0
        self.n = 0
        self.first: float | None = None
        self.last: float | None = None

    def tick(self, now: float) -> None:
        """One content event relayed at ``now``."""
        last = self.last
        self.last = now
        if last is None:
            self.first = now
            return
        gap = now - last
        self.counts[bisect_left(ITL_BUCKETS, gap)] += 1
        self.sum_s += gap
        self.n += 1

    @property
    def span_s(self) -> float:
        """Seconds from the first to the last event (0 before two events)."""
        if self.first is None or self.last is None:
            return 0.0
        return self.last - self.first


class _BulkChild:
    __slots__ = ("counts", "sum")

    def __init__(self, n: int) -> None:
        self.counts = [0] * n
        self.sum = 0.0

    def merge(self, timer: GapTimer) -> None:
        counts = self.counts
        for i, c in enumerate(timer.counts):
            if c:
                counts[i] += c
        self.sum += timer.sum_s


class BulkHistogram(Collector):
    """A histogram that takes a request's pre-bucketed ``GapTimer`` at once (O(buckets) per
    request instead of one observation per token). Single-threaded use (the event loop)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self.name, self.documentation = name, documentation
        self.labelnames = tuple(labelnames)
        self._les = [floatToGoString(b) for b in buckets] + ["+Inf"]
        self._children: dict[tuple[str, ...], _BulkChild] = {}
        registry.register(self)

    def labels(self, *values: str) -> _BulkChild:
        """The series of these label values (created on first use)."""
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = _BulkChild(len(self._les))
        return child

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[Metric]:
        fam = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for key, child in list(self._children.items()):
            buckets = list(zip(self._les, accumulate(child.counts), strict=True))
            fam.add_metric(list(key), buckets, child.sum)
        yield fam


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


def _operation(path: str) -> str:
    return "chat" if path.endswith("/chat/completions") else "text_completion"


class GatewayMetrics:
    """The gateway's metrics. At request end call ``record_request(rec)`` (``observe`` is the
    same); during the request ``record_attempt``/``record_retry``/``record_fallback``/
    ``record_timeout``. Replica load, health, ejections and retry-budget exhaustion are read
    from the pools at scrape time."""

    def __init__(self, pools: PoolRegistry) -> None:
        self.registry = r = CollectorRegistry()
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

    def record_request(self, rec: RequestRecord) -> None:
        """Record one finished request (once, at the end, on every exit path). Reads ``model``,
        ``asked_tier``/``served_tier``, ``outcome``, ``status``, ``stream``, ``usage``,
        ``usage_estimated``, ``cost_usd``, ``ttft_s``, ``e2e_s``, ``queue_s`` and ``itl``."""
        model = rec.model or ""
        served = rec.served_tier
        tier = served or rec.asked_tier or ""
        pool = f"{model}/{served}" if served else ""
        outcome = rec.outcome or ""
        self.requests.labels(model, tier, outcome, str(rec.status)).inc()
        g = (_operation(rec.path), model, tier, pool)
        if rec.e2e_s is not None:
            self.request_duration.labels(*g, outcome).observe(rec.e2e_s)
        if rec.queue_s is not None:
            self.queue.labels(model, tier).observe(rec.queue_s)
        if not served:
            return
        if rec.stream and rec.ttft_s is not None:
            self.ttft.labels(*g).observe(rec.ttft_s)
        u = rec.usage
        if u is not None:
            self.token_usage.labels(*g, "input").observe(u.prompt)
            self.token_usage.labels(*g, "output").observe(u.completion)
            self.token_usage.labels(*g, "cached_input").observe(u.cached)
            if rec.usage_estimated:
                self.usage_estimated.labels(model, tier, pool).inc()
        itl = rec.itl
        if itl is not None and itl.n:
            self.itl.labels(*g).merge(itl)
        if outcome == "ok" and rec.stream and u is not None and u.completion > 1:
            decode_s = itl.span_s if itl is not None and itl.n else None
            if decode_s is None and rec.e2e_s is not None and rec.ttft_s is not None:
                decode_s = max(0.0, rec.e2e_s - rec.ttft_s - (rec.queue_s or 0.0))
            if decode_s is not None:
                self.tpot.labels(*g).observe(decode_s / (u.completion - 1))
        if rec.cost_usd:
            self.cost.labels(model, tier, pool).inc(rec.cost_usd)
        choice = rec.auto_choice
        expected = getattr(choice, "expected_s", None)
        if expected and outcome == "ok" and rec.ttft_s is not None and choice.pool_key == pool:
            span = itl.span_s if rec.stream and itl is not None else 0.0
            self.auto_estimate_ratio.labels(pool).observe((rec.ttft_s + span) / expected)

    def observe(self, rec: RequestRecord) -> None:
        """Alias of ``record_request`` (the foundation's name)."""
        self.record_request(rec)

    def record_attempt(self, pool: Pool, result: str) -> None:
        """One upstream attempt on ``pool`` ended: ``ok`` or a failure slug (``connect-error``,
        ``http-503``, ``ttft-timeout``, ``client-error``...)."""
        self.attempts.labels(pool.model, pool.tier, pool.key, result).inc()

    def record_retry(self, pool: Pool, reason: str) -> None:
        """A retry on ``pool`` is about to start because of ``reason`` (the failure slug)."""
        self.retries.labels(pool.model, pool.tier, pool.key, reason).inc()

    def record_fallback(self, model: str, from_tier: str, to_tier: str) -> None:
        """The request moves from ``from_tier``'s pool to ``to_tier``'s."""
        self.fallbacks.labels(model, from_tier, to_tier).inc()

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
