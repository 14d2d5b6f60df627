"""OpenTelemetry for the gateway: traces, W3C trace-context propagation and OTLP export.

One ``Telemetry`` per app, built from ``TelemetryConfig`` (no global OpenTelemetry state: the
tracer provider is this object's own). Metrics are recorded by ``gateway.telemetry.metrics``
into the app's ``prometheus_client`` registry, which ``/metrics`` serves; when an OTLP endpoint
is configured the same registry is exported over OTLP/HTTP (``gateway.telemetry.otlp_metrics``)
next to the spans. Why not the OpenTelemetry SDK's instruments for recording: they cost ~8-14 µs per
measurement against ~1-2 µs (``loadtests/bench_telemetry.py``), and the inter-token histogram
would need one measurement per token.

OTLP endpoint: ``otlp_endpoint`` (the collector's base URL, e.g. ``http://otel-collector:4318``;
``/v1/traces`` and ``/v1/metrics`` are appended), else the standard environment variables
(``OTEL_EXPORTER_OTLP_ENDPOINT``, or the per-signal ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` /
``..._METRICS_ENDPOINT``; ``OTEL_EXPORTER_OTLP_HEADERS`` for collector credentials), read by the
OpenTelemetry exporters themselves. Without either, nothing is exported and no span is made.

Traces: a SERVER span per request (``start_request``), named ``{gen_ai.operation.name}
{gen_ai.request.model}`` as the GenAI conventions name inference spans, child of the client's
``traceparent`` when it sent one; a CLIENT span per upstream attempt (``RequestTrace.attempt``)
whose context goes to the engine in ``traceparent``. With ``traces: false``, or no exporter
(spans nobody receives would cost ~85 µs per request), no span is made and the client's
``traceparent``/``tracestate`` go to the engine unchanged (~1 µs). Attributes never carry an
API key, prompt or completion text, or a URL credential (replica URLs are redacted).
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.config import TelemetryConfig
from gateway.telemetry.otlp_metrics import MetricExporterLike, OtlpMetricsBridge

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from gateway.telemetry.record import RequestRecord

TRACE_HEADERS = (b"traceparent", b"tracestate")
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}")
_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
_PROPAGATOR = TraceContextTextMapPropagator()


def _otlp_configured(config: TelemetryConfig, environ: Mapping[str, str], signal: str) -> bool:
    return bool(
        config.otlp_endpoint
        or environ.get(_ENDPOINT_ENV)
        or environ.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")
    )


def _host_port(url: str | None) -> tuple[str | None, int | None]:
    if not url:
        return None, None
    try:
        parts = urlsplit(url)
        return parts.hostname, parts.port
    except ValueError:
        return None, None


class AttemptTrace:
    """The span of one upstream attempt. ``headers()`` for the upstream request; ``end()``
    once (also a context manager that ends with the exception's ``reason`` if left open).
    Without tracing ``span`` is None and ``headers()`` forwards the client's trace context."""

    __slots__ = ("_ended", "_forward", "span")

    def __init__(self, span: Span | None, forward: dict[str, str] | None = None) -> None:
        self.span = span
        self._forward = forward
        self._ended = False

    def headers(self) -> dict[str, str]:
        """``traceparent`` (and ``tracestate``) naming this attempt, to send to the engine."""
        if self.span is None:
            return dict(self._forward) if self._forward else {}
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(self.span))
        return carrier

    def end(self, outcome: str, *, status: int | None = None) -> None:
        """End the span: ``outcome`` is ``ok`` or the failure slug (``connect-error``...)."""
        if self._ended:
            return
        self._ended = True
        span = self.span
        if span is None:
            return
        if span.is_recording():
            span.set_attribute("speedgate.outcome", outcome)
            if status is not None:
                span.set_attribute("http.response.status_code", status)
            if outcome != "ok":
                span.set_attribute("error.type", outcome)
                span.set_status(Status(StatusCode.ERROR))
        span.end()

    def __enter__(self) -> AttemptTrace:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if not self._ended:
            reason = getattr(exc, "reason", None) or (type(exc).__name__ if exc else "ok")
            self.end(reason)


class RequestTrace:
    """The span of one request (non-recording when sampled out; None without tracing, when
    the client's trace headers are only forwarded). ``attempt()`` per upstream try,
    ``finish(rec)`` once at the end."""

    __slots__ = ("_ended", "_forward", "_tracer", "operation", "span")

    def __init__(
        self,
        tracer: trace.Tracer | None,
        span: Span | None,
        operation: str,
        forward: dict[str, str] | None = None,
    ) -> None:
        self._tracer = tracer
        self.span = span
        self.operation = operation
        self._forward = forward
        self._ended = False

    @property
    def trace_id(self) -> str | None:
        """The W3C trace id (32 hex digits), or None when there is no valid trace context."""
        if self.span is None:
            tp = (self._forward or {}).get("traceparent", "")
            m = _TRACEPARENT.fullmatch(tp.strip().lower())
            return m.group(1) if m and m.group(1) != "0" * 32 else None
        ctx = self.span.get_span_context()
        return format(ctx.trace_id, "032x") if ctx.is_valid else None

    def attempt(
        self,
        *,
        pool: str,
        tier: str,
        replica: str,
        model: str,
        number: int,
        retry_reason: str | None = None,
    ) -> AttemptTrace:
        """Start the CLIENT span of attempt ``number`` (1-based) of ``model`` (the served
        model name) on ``replica`` (its redacted URL) of ``pool``; ``retry_reason`` is why the
        previous attempt failed when this one is a retry or a fallback."""
        if self.span is None or self._tracer is None:
            return AttemptTrace(None, self._forward)
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": self.operation,
            "gen_ai.request.model": model,
            "speedgate.pool": pool,
            "speedgate.tier": tier,
            "speedgate.replica": replica,
            "speedgate.attempt": number,
        }
        host, port = _host_port(replica)
        if host:
            attrs["server.address"] = host
        if port:
            attrs["server.port"] = port
        if retry_reason:
            attrs["speedgate.retry_reason"] = retry_reason
        span = self._tracer.start_span(
            f"{self.operation} {model}",
            context=trace.set_span_in_context(self.span),
            kind=SpanKind.CLIENT,
            attributes=attrs,
        )
        return AttemptTrace(span)

    def finish(self, rec: RequestRecord) -> None:
        """Name the span after the model, set the request's attributes and end it."""
        if self._ended:
            return
        self._ended = True
        span = self.span
        if span is None:
            return
        if span.is_recording():
            if rec.model:
                span.update_name(f"{self.operation} {rec.model}")
            attrs: dict[str, Any] = {
                "speedgate.request_id": rec.request_id,
                "http.response.status_code": rec.status,
                "speedgate.outcome": rec.outcome or "",
                "speedgate.attempts": rec.attempts,
                "speedgate.stream": rec.stream,
            }
            optional = {
                "gen_ai.request.model": rec.model,
                "gen_ai.conversation.id": rec.session_id,
                "speedgate.key_id": rec.key_id,
                "speedgate.tier.asked": rec.asked_tier,
                "speedgate.tier": rec.served_tier,
                "speedgate.pool": f"{rec.model}/{rec.served_tier}" if rec.served_tier else None,
                "speedgate.replica": rec.replica,
                "speedgate.fallback": rec.fallback,
                "speedgate.cost_usd": rec.cost_usd,
                "speedgate.ttft_s": rec.ttft_s,
            }
            attrs.update({k: v for k, v in optional.items() if v is not None})
            if rec.retries:
                attrs["speedgate.retries"] = list(rec.retries)
            if rec.resumes:  # each mid-stream resume: how it broke, what followed
                attrs["speedgate.resumes"] = [
                    f"{r['reason']}:{r.get('outcome')}:{r.get('to_tier') or r.get('rule')}"
                    for r in rec.resumes
                ]
                attrs["speedgate.resume.carried_chars"] = sum(
                    r.get("carried_chars", 0) for r in rec.resumes)
            if rec.usage_estimated:
                attrs["speedgate.usage_estimated"] = True
            if rec.usage is not None:
                attrs["gen_ai.usage.input_tokens"] = rec.usage.prompt
                attrs["gen_ai.usage.output_tokens"] = rec.usage.completion
                attrs["gen_ai.usage.cache_read.input_tokens"] = rec.usage.cached
            span.set_attributes(attrs)
            if rec.outcome != "ok":
                span.set_attribute("error.type", rec.outcome or "_OTHER")
                span.set_status(Status(StatusCode.ERROR))
        span.end()


def _trace_headers(headers: Iterable[tuple[bytes, bytes]]) -> dict[str, str] | None:
    carrier: dict[str, str] = {}
    for k, v in headers:
        if k in TRACE_HEADERS:
            carrier[k.decode("latin-1")] = v.decode("latin-1")
    return carrier or None


class Telemetry:
    """Traces and OTLP export of one app. ``start_request`` per request; ``await start()`` and
    ``await shutdown()`` in the app's lifespan.

    ``span_exporter`` / ``metric_exporter`` replace the OTLP exporters (tests: an
    ``InMemorySpanExporter``, exported synchronously); ``environ`` replaces ``os.environ``.
    """

    def __init__(
        self,
        config: TelemetryConfig,
        *,
        registry: CollectorRegistry | None = None,
        span_exporter: SpanExporter | None = None,
        metric_exporter: MetricExporterLike | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        env = os.environ if environ is None else environ
        self.config = config
        self.resource = Resource.create({"service.name": config.service_name})
        self.provider: TracerProvider | None = None
        self.bridge: OtlpMetricsBridge | None = None
        base = config.otlp_endpoint
        # Spans are recorded only when they go somewhere; otherwise requests pay ~1 µs to
        # forward the client's trace context instead of ~100 µs for spans nobody sees.
        self.tracing = config.traces and (
            span_exporter is not None or _otlp_configured(config, env, "TRACES")
        )
        self.tracer: trace.Tracer | None = None
        if self.tracing:
            self.provider = TracerProvider(
                resource=self.resource,
                sampler=ParentBased(TraceIdRatioBased(config.trace_sample_ratio)),
            )
            if span_exporter is not None:
                self.provider.add_span_processor(SimpleSpanProcessor(span_exporter))
            else:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                    OTLPSpanExporter,
                )

                exporter = OTLPSpanExporter(
                    endpoint=f"{base}/v1/traces" if base else None,
                    timeout=config.otlp_timeout_s,
                )
                self.provider.add_span_processor(BatchSpanProcessor(exporter))
            self.tracer = self.provider.get_tracer("speedgate")
        if (
            metric_exporter is None
            and registry is not None
            and _otlp_configured(config, env, "METRICS")
        ):
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                OTLPMetricExporter,
            )

            metric_exporter = OTLPMetricExporter(
                endpoint=f"{base}/v1/metrics" if base else None, timeout=config.otlp_timeout_s
            )
        if metric_exporter is not None and registry is not None:
            self.bridge = OtlpMetricsBridge(
                registry,
                metric_exporter,
                self.resource,
                interval_s=config.otlp_metrics_interval_s,
                provider_name=config.genai_provider_name,
                timeout_s=config.otlp_timeout_s,
            )

    def start_request(
        self,
        headers: Iterable[tuple[bytes, bytes]],
        operation: str = "chat",
        attributes: Mapping[str, str] | None = None,
    ) -> RequestTrace:
        """Start the SERVER span of a request whose ASGI ``headers`` may carry a W3C
        ``traceparent``; ``operation`` is the protocol's ``gen_ai.operation.name`` (``chat``,
        ``text_completion``...), ``attributes`` the protocol's own (``openai.api.type``)."""
        incoming = _trace_headers(headers)
        if self.tracer is None:
            return RequestTrace(None, None, operation, incoming)
        span = self.tracer.start_span(
            operation,
            context=_PROPAGATOR.extract(incoming) if incoming else None,
            kind=SpanKind.SERVER,
            attributes={"gen_ai.operation.name": operation, **(attributes or {})},
        )
        return RequestTrace(self.tracer, span, operation)

    async def start(self) -> None:
        """Start the periodic OTLP metrics export (if configured)."""
        if self.bridge is not None:
            self.bridge.start()

    async def shutdown(self) -> None:
        """Export the last metrics and flush the spans, then stop."""
        if self.bridge is not None:
            await self.bridge.stop()
        if self.provider is not None:
            await asyncio.to_thread(self.provider.shutdown)
