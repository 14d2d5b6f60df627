"""OTLP export of the gateway's Prometheus registry: the same numbers as ``/metrics``, sent to an
OpenTelemetry collector with OpenTelemetry names.

The request path records into ``prometheus_client`` only (``gateway.telemetry.metrics``); every
``interval_s`` this bridge collects the registry and posts it, both in a worker thread (a
collection is as thread-safe as a Prometheus scrape and costs about as much, ~5 ms for ~1,000
series), so the event loop only schedules it. Counters become cumulative monotonic Sums, gauges
Gauges, histograms cumulative explicit-bucket Histograms (min/max unknown, left unset), all with
one start time (the bridge's creation, when the registry's values were zero).

Names: the GenAI families get their semantic-convention names and units back
(``gen_ai_server_time_to_first_token_seconds`` → ``gen_ai.server.time_to_first_token``, ``s``);
``speedgate_*`` families become ``speedgate.*`` with the unit suffix moved to the unit
(``speedgate_queue_time_seconds`` → ``speedgate.queue_time``, ``s``). Labels map to attributes
(``gen_ai_request_model`` and ``model`` → ``gen_ai.request.model``, ``status`` →
``http.response.status_code``, others → ``speedgate.<label>``), and GenAI metrics get the
required ``gen_ai.provider.name``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from typing import Any, Protocol

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric as PromMetric

log = logging.getLogger("speedgate.telemetry")

GENAI_NAMES: dict[str, tuple[str, str]] = {
    "gen_ai_server_request_duration_seconds": ("gen_ai.server.request.duration", "s"),
    "gen_ai_server_time_to_first_token_seconds": ("gen_ai.server.time_to_first_token", "s"),
    "gen_ai_server_time_per_output_token_seconds": ("gen_ai.server.time_per_output_token", "s"),
    "gen_ai_client_token_usage": ("gen_ai.client.token.usage", "{token}"),
    "gen_ai_client_operation_time_per_output_chunk_seconds": (
        "gen_ai.client.operation.time_per_output_chunk",
        "s",
    ),
}
LABEL_ATTRIBUTES: dict[str, str] = {
    "gen_ai_operation_name": "gen_ai.operation.name",
    "gen_ai_request_model": "gen_ai.request.model",
    "gen_ai_token_type": "gen_ai.token.type",
    "model": "gen_ai.request.model",
    "status": "http.response.status_code",
}
_UNIT_SUFFIXES = (("_seconds", "s"), ("_usd", "USD"))
_CUMULATIVE = AggregationTemporality.CUMULATIVE


class MetricExporterLike(Protocol):
    """What the bridge needs of an exporter (``OTLPMetricExporter`` has it)."""

    def export(self, metrics_data: MetricsData, timeout_millis: float = ..., **kwargs: Any) -> Any:
        """Send ``metrics_data``."""

    def shutdown(self, timeout_millis: float = ..., **kwargs: Any) -> None:
        """Release resources."""


def otel_name(prom_name: str) -> tuple[str, str]:
    """``(name, unit)`` of a Prometheus family name (see the module docstring)."""
    if prom_name in GENAI_NAMES:
        return GENAI_NAMES[prom_name]
    unit = ""
    for suffix, u in _UNIT_SUFFIXES:
        if prom_name.endswith(suffix):
            prom_name, unit = prom_name[: -len(suffix)], u
            break
    if prom_name.startswith("speedgate_"):
        prom_name = "speedgate." + prom_name[len("speedgate_") :]
    return prom_name, unit


def _attributes(labels: dict[str, str], extra: dict[str, str]) -> dict[str, Any]:
    attrs: dict[str, Any] = dict(extra)
    for k, v in labels.items():
        if k == "le":
            continue
        key = LABEL_ATTRIBUTES.get(k, "speedgate." + k)
        attrs[key] = int(v) if key == "http.response.status_code" and v.isdigit() else v
    return attrs


def _label_key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k != "le"))


def _histogram_points(
    fam: PromMetric, extra: dict[str, str], start_ns: int, now_ns: int
) -> list[HistogramDataPoint]:
    series: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
    for s in fam.samples:
        key = _label_key(s.labels)
        d = series.setdefault(key, {"labels": s.labels, "buckets": [], "sum": 0.0, "count": 0})
        if s.name.endswith("_bucket"):
            d["buckets"].append((float(s.labels["le"]), s.value))
        elif s.name.endswith("_sum"):
            d["sum"] = s.value
        elif s.name.endswith("_count"):
            d["count"] = int(s.value)
    points = []
    for d in series.values():
        buckets = sorted(d["buckets"])
        bounds = [le for le, _ in buckets if le != float("inf")]
        cumulative = [int(c) for _, c in buckets]
        counts = [c - p for c, p in zip(cumulative, [0, *cumulative[:-1]], strict=True)]
        points.append(
            HistogramDataPoint(
                attributes=_attributes(d["labels"], extra),
                start_time_unix_nano=start_ns,
                time_unix_nano=now_ns,
                count=d["count"] or (cumulative[-1] if cumulative else 0),
                sum=d["sum"],
                bucket_counts=counts,
                explicit_bounds=bounds,
                min=None,  # type: ignore[arg-type]  # unknown: left unset in OTLP
                max=None,  # type: ignore[arg-type]
            )
        )
    return points


def _number_points(
    fam: PromMetric, suffix: str, extra: dict[str, str], start_ns: int, now_ns: int
) -> list[NumberDataPoint]:
    return [
        NumberDataPoint(
            attributes=_attributes(s.labels, extra),
            start_time_unix_nano=start_ns,
            time_unix_nano=now_ns,
            value=s.value,
        )
        for s in fam.samples
        if s.name == fam.name + suffix
    ]


def convert(
    families: Iterable[PromMetric], *, start_ns: int, now_ns: int, provider_name: str
) -> list[Metric]:
    """OpenTelemetry metrics for Prometheus metric families (unsupported types are skipped)."""
    out: list[Metric] = []
    for fam in families:
        name, unit = otel_name(fam.name)
        extra = {"gen_ai.provider.name": provider_name} if name.startswith("gen_ai.") else {}
        data: Sum | Gauge | Histogram
        if fam.type == "counter":
            points = _number_points(fam, "_total", extra, start_ns, now_ns)
            data = Sum(points, _CUMULATIVE, is_monotonic=True)
        elif fam.type == "gauge":
            data = Gauge(_number_points(fam, "", extra, start_ns, now_ns))
        elif fam.type == "histogram":
            data = Histogram(_histogram_points(fam, extra, start_ns, now_ns), _CUMULATIVE)
        else:
            continue
        if data.data_points:
            out.append(Metric(name=name, description=fam.documentation, unit=unit, data=data))
    return out


class OtlpMetricsBridge:
    """Periodic OTLP export of ``registry``. ``start()`` inside the event loop; ``await
    stop()`` exports a last time and shuts the exporter down."""

    def __init__(
        self,
        registry: CollectorRegistry,
        exporter: MetricExporterLike,
        resource: Resource,
        *,
        interval_s: float,
        provider_name: str,
        timeout_s: float = 5.0,
    ) -> None:
        self.registry = registry
        self.exporter = exporter
        self.resource = resource
        self.interval_s = interval_s
        self.provider_name = provider_name
        self.timeout_s = timeout_s
        self.start_ns = time.time_ns()
        self.scope = InstrumentationScope("speedgate")
        self.failures = 0
        self._task: asyncio.Task[None] | None = None

    def collect(self) -> MetricsData:
        """The registry's current values as OTLP ``MetricsData``."""
        metrics = convert(
            self.registry.collect(),
            start_ns=self.start_ns,
            now_ns=time.time_ns(),
            provider_name=self.provider_name,
        )
        scope = ScopeMetrics(scope=self.scope, metrics=metrics, schema_url="")
        return MetricsData([ResourceMetrics(self.resource, [scope], schema_url="")])

    def _collect_and_export(self) -> Any:
        return self.exporter.export(self.collect(), timeout_millis=self.timeout_s * 1000)

    async def export_once(self) -> bool:
        """Collect and export in a worker thread; False (logged) when the export failed."""
        try:
            result = await asyncio.to_thread(self._collect_and_export)
        except Exception as e:  # an exporter should not raise; never let it kill the loop
            result = e
        ok = result is None or getattr(result, "name", "") == "SUCCESS"
        if not ok:
            self.failures += 1
            if self.failures == 1 or self.failures % 100 == 0:
                log.warning("OTLP metrics export failed (%d so far): %s", self.failures, result)
        return ok

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.export_once()

    def start(self) -> None:
        """Start the periodic export task (call from the event loop)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop the task, export the final values, shut the exporter down."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
            await self.export_once()
        await asyncio.to_thread(self.exporter.shutdown)
