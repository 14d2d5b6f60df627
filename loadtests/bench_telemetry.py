"""CPU cost of the gateway's telemetry per request, and the recording design it justifies.

Method: in one process, no I/O, each operation is repeated ``--requests`` times per round and
timed with ``perf_counter``; the table shows the median over ``--rounds`` rounds of the cost per
call. A "request" is a successful streamed chat request of ``--chunks`` content events (so
``chunks - 1`` inter-token gaps) on a registry that already holds series for 2 models × 2 tiers
× 3 outcomes. Rows:

- ``metrics.record_request``: everything ``gateway.telemetry.metrics`` records at request end
  (requests, duration, queue, TTFT, TPOT, 3 token-usage observations, cost, the ITL merge);
- ``GapTimer.tick``: per content event, while relaying (×chunks per request);
- ``metrics.record_attempt``: per upstream attempt;
- ``traces on``: request span + one attempt span + ``traceparent`` injection + both ends, SDK
  tracer with a batch processor in front of a do-nothing exporter (export cost is off-loop);
- ``traces off``: the same calls without tracing (``traces: false``, or no exporter
  configured): the client's ``traceparent`` is only forwarded;
- ``cost_usd`` and ``access JSON line`` (formatting only, no I/O);
- the alternative: the OpenTelemetry SDK's own instruments (``MeterProvider`` with the
  Prometheus reader, exemplars off) recording the same measurements, ITL as one histogram
  record per gap — what ``gateway.telemetry.metrics`` would cost built on the SDK;
- scrape (``render()``) and OTLP conversion (``OtlpMetricsBridge.collect``): per scrape/export,
  not per request.

Run::

    .venv/bin/python -m loadtests.bench_telemetry
    .venv/bin/python -m loadtests.bench_telemetry --requests 2000 --chunks 512 --json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics._internal.exemplar import AlwaysOffExemplarFilter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from prometheus_client import CollectorRegistry

from gateway.common.usage import Usage
from gateway.config import Prices, TelemetryConfig, load_config
from gateway.fleet.pools import PoolRegistry
from gateway.telemetry.access_log import format_json
from gateway.telemetry.cost import cost_usd
from gateway.telemetry.histograms import (
    DURATION_BUCKETS,
    ITL_BUCKETS,
    QUEUE_BUCKETS,
    TOKEN_BUCKETS,
    TPOT_BUCKETS,
    TTFT_BUCKETS,
    GapTimer,
)
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.otlp_metrics import OtlpMetricsBridge
from gateway.telemetry.record import RequestRecord
from gateway.telemetry.tracing import Telemetry

TRACEPARENT = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
PRICES = Prices(input_per_mtok_usd=1.0, cached_input_per_mtok_usd=0.1, output_per_mtok_usd=2.0)


class _NullSpanExporter(SpanExporter):
    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


class _NullMetricExporter:
    def export(self, metrics_data: Any, timeout_millis: float = 0, **kwargs: Any) -> None:
        return None

    def shutdown(self, timeout_millis: float = 0, **kwargs: Any) -> None:
        return None


def _pools() -> PoolRegistry:
    def tiers(n: int) -> dict[str, Any]:
        return {
            t: {
                "endpoints": [f"http://127.0.0.1:{9000 + n * 10 + i}" for i in range(2)],
                "served_model_name": f"m{n}-{t}",
            }
            for t in ("standard", "fast")
        }

    return PoolRegistry(load_config(models={f"m{n}": {"tiers": tiers(n)} for n in range(2)}))


def _record(model: str, tier: str, outcome: str, chunks: int) -> RequestRecord:
    rec = RequestRecord(
        request_id="bench", path="/v1/chat/completions", model=model, asked_tier=tier, stream=True
    )
    rec.served_tier, rec.status, rec.outcome = tier, 200 if outcome == "ok" else 502, outcome
    rec.usage = Usage(prompt=2006, completion=chunks, cached=1920)
    rec.ttft_s, rec.e2e_s, rec.queue_s = 0.12, 0.12 + chunks * 0.02, 0.0004
    rec.cost_usd = cost_usd(rec.usage, PRICES)
    rec.itl = GapTimer()
    t = 0.0
    for i in range(chunks):
        t += 0.015 + (i % 7) * 0.002
        rec.itl.tick(t)
    return rec


def _warm(metrics: GatewayMetrics, chunks: int) -> None:
    for model in ("m0", "m1"):
        for tier in ("standard", "fast"):
            for outcome in ("ok", "upstream_error", "timeout"):
                metrics.record_request(_record(model, tier, outcome, chunks))


def _time(fn: Callable[[], Any], n: int, rounds: int) -> float:
    """Median seconds per call over ``rounds`` rounds of ``n`` calls."""
    per = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        per.append((time.perf_counter() - t0) / n)
    return statistics.median(per)


def _otel_sdk_alternative(chunks: int) -> Callable[[RequestRecord], None]:
    """The same per-request measurements through OpenTelemetry SDK instruments."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader

    reader = PrometheusMetricReader(
        registry=CollectorRegistry(), disable_target_info=True, scope_info_enabled=False
    )
    provider = MeterProvider(
        metric_readers=[reader],
        resource=Resource.create({}),
        exemplar_filter=AlwaysOffExemplarFilter(),
    )
    meter = provider.get_meter("speedgate")

    def hist(name: str, unit: str, bounds: Sequence[float]) -> Any:
        return meter.create_histogram(name, unit=unit, explicit_bucket_boundaries_advisory=bounds)

    requests = meter.create_counter("speedgate.requests")
    duration = hist("gen_ai.server.request.duration", "s", DURATION_BUCKETS)
    queue = hist("speedgate.queue_time", "s", QUEUE_BUCKETS)
    ttft = hist("gen_ai.server.time_to_first_token", "s", TTFT_BUCKETS)
    tpot = hist("gen_ai.server.time_per_output_token", "s", TPOT_BUCKETS)
    usage = hist("gen_ai.client.token.usage", "{token}", TOKEN_BUCKETS)
    itl = hist("gen_ai.client.operation.time_per_output_chunk", "s", ITL_BUCKETS)
    cost = meter.create_counter("speedgate.cost", unit="USD")
    gaps = [0.015 + (i % 7) * 0.002 for i in range(chunks - 1)]

    def record(rec: RequestRecord) -> None:
        u = rec.usage
        assert u is not None and rec.e2e_s is not None and rec.ttft_s is not None
        a = {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": rec.model,
            "speedgate.tier": rec.served_tier,
            "speedgate.pool": f"{rec.model}/fast",
        }
        requests.add(
            1,
            {
                "gen_ai.request.model": rec.model,
                "speedgate.tier": rec.served_tier,
                "speedgate.outcome": "ok",
                "http.response.status_code": 200,
            },
        )
        duration.record(rec.e2e_s, {**a, "speedgate.outcome": "ok"})
        queue.record(
            rec.queue_s or 0.0,
            {"gen_ai.request.model": rec.model, "speedgate.tier": rec.served_tier},
        )
        ttft.record(rec.ttft_s, a)
        tpot.record((rec.e2e_s - rec.ttft_s) / (u.completion - 1), a)
        for kind, v in (("input", u.prompt), ("output", u.completion), ("cached_input", u.cached)):
            usage.record(v, {**a, "gen_ai.token.type": kind})
        cost.add(rec.cost_usd or 0.0, a)
        for g in gaps:  # one record per gap, as the SDK has no bulk API
            itl.record(g, a)

    return record


def run(requests: int, chunks: int, rounds: int) -> list[tuple[str, float, str]]:
    """Rows of (operation, seconds per call, per what)."""
    pools = _pools()
    metrics = GatewayMetrics(pools)
    _warm(metrics, chunks)
    rec = _record("m0", "fast", "ok", chunks)
    fast = pools.get("m0", "fast")
    assert fast is not None
    rows: list[tuple[str, float, str]] = []
    rows.append(
        (
            "metrics.record_request (prometheus_client)",
            _time(lambda: metrics.record_request(rec), requests, rounds),
            "request",
        )
    )
    timer = GapTimer()
    clock = iter(range(10**9)).__next__
    rows.append(
        (
            "GapTimer.tick (ITL, per content event)",
            _time(lambda: timer.tick(clock() * 0.01), requests * 10, rounds),
            "event",
        )
    )
    rows.append(
        (
            "metrics.record_attempt",
            _time(lambda: metrics.record_attempt(fast, "ok"), requests, rounds),
            "attempt",
        )
    )

    headers = [(b"content-type", b"application/json"), (b"traceparent", TRACEPARENT)]

    def traced(tel: Telemetry) -> Callable[[], None]:
        def one() -> None:
            rt = tel.start_request(headers, "chat")
            att = rt.attempt(
                pool="m0/fast",
                tier="fast",
                replica="http://127.0.0.1:9000",
                model="m0-fast",
                number=1,
            )
            att.headers()
            att.end("ok")
            rt.finish(rec)

        return one

    on = Telemetry(TelemetryConfig(), span_exporter=_NullSpanExporter())
    rows.append(
        (
            "traces on: request + 1 attempt span, inject",
            _time(traced(on), requests, rounds),
            "request",
        )
    )
    off = Telemetry(TelemetryConfig(traces=False))
    rows.append(
        (
            "traces off / no exporter: traceparent forwarded",
            _time(traced(off), requests, rounds),
            "request",
        )
    )
    rows.append(
        ("cost_usd", _time(lambda: cost_usd(rec.usage, PRICES), requests, rounds), "request")
    )
    rows.append(
        (
            "access JSON line (format only)",
            _time(lambda: format_json(rec), requests, rounds),
            "request",
        )
    )
    alt = _otel_sdk_alternative(chunks)
    rows.append(
        (
            f"ALTERNATIVE: OTel SDK instruments, ITL per gap ({chunks - 1} gaps)",
            _time(lambda: alt(rec), max(1, requests // 10), rounds),
            "request",
        )
    )
    rows.append(
        (
            "scrape: GatewayMetrics.render()",
            _time(metrics.render, max(1, requests // 100), rounds),
            "scrape",
        )
    )
    bridge = OtlpMetricsBridge(
        metrics.registry,
        _NullMetricExporter(),
        Resource.create({}),
        interval_s=30,
        provider_name="speedgate",
    )
    rows.append(
        (
            "OTLP export: registry → MetricsData",
            _time(bridge.collect, max(1, requests // 100), rounds),
            "export",
        )
    )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=5000, help="calls per round (default 5000)")
    ap.add_argument("--chunks", type=int, default=256, help="content events per request")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args(argv)
    rows = run(args.requests, args.chunks, args.rounds)
    if args.json:
        print(
            json.dumps(
                {
                    "python": sys.version.split()[0],
                    "machine": platform.machine(),
                    "chunks": args.chunks,
                    "rows": [{"op": o, "us": s * 1e6, "per": p} for o, s, p in rows],
                }
            )
        )
        return 0
    print(
        f"Python {sys.version.split()[0]} on {platform.machine()}; {args.chunks} content "
        f"events per request; median of {args.rounds} rounds\n"
    )
    print(f"{'operation':<62} {'µs':>10}  per")
    for op, s, per in rows:
        print(f"{op:<62} {s * 1e6:>10.2f}  {per}")
    by = {o: s for o, s, _ in rows}
    tick = by["GapTimer.tick (ITL, per content event)"]
    total = (
        by["metrics.record_request (prometheus_client)"]
        + tick * args.chunks
        + by["metrics.record_attempt"]
        + by["cost_usd"]
        + by["access JSON line (format only)"]
    )
    print(
        f"\nper request, metrics + ITL + 1 attempt + cost + JSON line: {total * 1e6:.1f} µs; "
        f"with traces on: {(total + by['traces on: request + 1 attempt span, inject']) * 1e6:.1f}"
        " µs"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
