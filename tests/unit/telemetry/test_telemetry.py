"""Traces (in-memory exporter), W3C trace-context propagation, OTLP export of the registry."""

import asyncio
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import CollectorRegistry

from gateway.common.usage import Usage
from gateway.config import TelemetryConfig, load_config
from gateway.fleet.pools import PoolRegistry
from gateway.telemetry.histograms import GapTimer
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.otlp_metrics import convert, otel_name
from gateway.telemetry.record import RequestRecord
from gateway.telemetry.tracing import Telemetry

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"


def _pools():
    return PoolRegistry(load_config(models={"m": {"tiers": {
        "fast": {"endpoints": ["http://127.0.0.1:9003"], "served_model_name": "m-fast"},
        "standard": {"endpoints": ["http://127.0.0.1:9001"], "served_model_name": "m-std"}},
        "fallback": {"fast": "standard"}}}))


def _finished_rec():
    rec = RequestRecord(request_id="req-1", path="/v1/chat/completions", model="m",
                        asked_tier="fast", stream=True)
    rec.served_tier, rec.replica = "standard", "http://127.0.0.1:9001"
    rec.status, rec.outcome = 200, "ok"
    rec.attempts, rec.retries, rec.fallback = 2, ["fast:connect-error"], "fast:connect-error"
    rec.usage = Usage(prompt=100, completion=40, cached=10)
    rec.cost_usd, rec.ttft_s, rec.e2e_s = 0.0001, 0.05, 0.5
    rec.key_id, rec.session_id = "team-a", "sess-1"
    rec.itl = GapTimer()
    for t in (0.0, 0.01, 0.02):
        rec.itl.tick(t)
    return rec


def test_request_and_attempt_spans_with_propagation():
    exporter = InMemorySpanExporter()
    tel = Telemetry(TelemetryConfig(), span_exporter=exporter)
    rt = tel.start_request([(b"content-type", b"application/json"),
                            (b"traceparent", TRACEPARENT.encode())], "chat")
    assert rt.trace_id == CLIENT_TRACE
    with rt.attempt(pool="m/fast", tier="fast", replica="http://127.0.0.1:9003", model="m-fast",
                    number=1) as a1:
        a1.end("connect-error")
    a2 = rt.attempt(pool="m/standard", tier="standard", replica="http://127.0.0.1:9001",
                    model="m-std", number=2, retry_reason="fast:connect-error")
    hdrs = a2.headers()
    a2.end("ok", status=200)
    rec = _finished_rec()
    rt.finish(rec)
    rt.finish(rec)  # idempotent

    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"chat m", "chat m-fast", "chat m-std"}
    req, att1, att2 = spans["chat m"], spans["chat m-fast"], spans["chat m-std"]
    # the request span continues the client's trace
    assert req.kind == SpanKind.SERVER
    assert format(req.context.trace_id, "032x") == CLIENT_TRACE
    assert format(req.parent.span_id, "016x") == CLIENT_SPAN
    # one CLIENT child per attempt
    for att in (att1, att2):
        assert att.kind == SpanKind.CLIENT
        assert att.parent.span_id == req.context.span_id
        assert att.context.trace_id == req.context.trace_id
    assert att1.attributes["speedgate.outcome"] == "connect-error"
    assert att1.status.status_code == StatusCode.ERROR
    assert att2.attributes["speedgate.retry_reason"] == "fast:connect-error"
    assert att2.attributes["speedgate.replica"] == "http://127.0.0.1:9001"
    assert att2.attributes["server.address"] == "127.0.0.1"
    assert att2.attributes["server.port"] == 9001
    assert att2.attributes["speedgate.tier"] == "standard"
    assert att2.attributes["speedgate.attempt"] == 2
    # traceparent sent upstream names the attempt span in the client's trace
    assert hdrs["traceparent"] == (
        f"00-{CLIENT_TRACE}-{format(att2.context.span_id, '016x')}-01")
    a = req.attributes
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "m"
    assert a["gen_ai.usage.input_tokens"] == 100 and a["gen_ai.usage.output_tokens"] == 40
    assert a["gen_ai.usage.cache_read.input_tokens"] == 10
    assert a["speedgate.tier"] == "standard" and a["speedgate.tier.asked"] == "fast"
    assert a["speedgate.pool"] == "m/standard" and a["speedgate.outcome"] == "ok"
    assert a["http.response.status_code"] == 200 and a["speedgate.cost_usd"] == 0.0001
    assert a["gen_ai.conversation.id"] == "sess-1" and a["speedgate.key_id"] == "team-a"
    assert req.status.status_code == StatusCode.UNSET


def test_new_trace_without_traceparent_and_error_outcome():
    exporter = InMemorySpanExporter()
    tel = Telemetry(TelemetryConfig(), span_exporter=exporter)
    rt = tel.start_request([], "text_completion")
    assert rt.trace_id is not None and rt.trace_id != CLIENT_TRACE
    rec = RequestRecord(request_id="r", path="/v1/completions", model="m")
    rec.status, rec.outcome = 504, "timeout"
    rt.finish(rec)
    (span,) = exporter.get_finished_spans()
    assert span.name == "text_completion m" and span.parent is None
    assert span.attributes["error.type"] == "timeout"
    assert span.status.status_code == StatusCode.ERROR


def test_traces_off_forward_the_clients_traceparent_unchanged():
    tel = Telemetry(TelemetryConfig(traces=False))
    rt = tel.start_request([(b"traceparent", TRACEPARENT.encode()),
                            (b"tracestate", b"vendor=1")])
    att = rt.attempt(pool="m/fast", tier="fast", replica="http://h:1", model="m", number=1)
    assert att.headers() == {"traceparent": TRACEPARENT, "tracestate": "vendor=1"}
    att.end("ok")
    rt.finish(_finished_rec())
    assert rt.trace_id == CLIENT_TRACE
    # traces off wins over a configured exporter; no incoming context: nothing to forward
    off = Telemetry(TelemetryConfig(traces=False), span_exporter=InMemorySpanExporter())
    assert not off.tracing
    rt2 = off.start_request([])
    assert rt2.attempt(pool="p", tier="t", replica="", model="m", number=1).headers() == {}
    assert rt2.trace_id is None


def test_sampled_out_parent_is_respected_and_still_propagated():
    exporter = InMemorySpanExporter()
    tel = Telemetry(TelemetryConfig(), span_exporter=exporter)
    unsampled = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-00"
    rt = tel.start_request([(b"traceparent", unsampled.encode())])
    att = rt.attempt(pool="p", tier="t", replica="", model="m", number=1)
    assert att.headers()["traceparent"].startswith(f"00-{CLIENT_TRACE}-")
    assert att.headers()["traceparent"].endswith("-00")
    att.end("ok")
    rt.finish(_finished_rec())
    assert exporter.get_finished_spans() == ()


def test_config_validation():
    assert TelemetryConfig(otlp_endpoint="http://c:4318/").otlp_endpoint == "http://c:4318"
    with pytest.raises(ValueError):
        TelemetryConfig(otlp_endpoint="c:4318")
    with pytest.raises(ValueError):
        TelemetryConfig(unknown=1)


def test_otel_names():
    assert otel_name("gen_ai_server_time_to_first_token_seconds") == (
        "gen_ai.server.time_to_first_token", "s")
    assert otel_name("gen_ai_client_token_usage") == ("gen_ai.client.token.usage", "{token}")
    assert otel_name("speedgate_queue_time_seconds") == ("speedgate.queue_time", "s")
    assert otel_name("speedgate_cost_usd") == ("speedgate.cost", "USD")
    assert otel_name("speedgate_requests") == ("speedgate.requests", "")


def test_registry_converts_to_otel_metrics():
    pools = _pools()
    m = GatewayMetrics(pools)
    m.record_request(_finished_rec())
    m.record_request(_finished_rec())
    metrics = {x.name: x for x in convert(m.registry.collect(), start_ns=1, now_ns=2,
                                          provider_name="speedgate")}
    usage = metrics["gen_ai.client.token.usage"]
    assert usage.unit == "{token}"
    pts = {p.attributes["gen_ai.token.type"]: p for p in usage.data.data_points}
    assert pts["input"].sum == 200 and pts["input"].count == 2
    assert pts["input"].attributes["gen_ai.request.model"] == "m"
    assert pts["input"].attributes["gen_ai.provider.name"] == "speedgate"
    assert pts["input"].attributes["speedgate.tier"] == "standard"
    assert sum(pts["input"].bucket_counts) == 2  # per-bucket, not cumulative
    assert len(pts["input"].bucket_counts) == len(pts["input"].explicit_bounds) + 1
    req = metrics["speedgate.requests"]
    assert req.data.is_monotonic
    (p,) = req.data.data_points
    assert p.value == 2 and p.attributes["http.response.status_code"] == 200
    assert "gen_ai.provider.name" not in p.attributes
    itl = metrics["gen_ai.client.operation.time_per_output_chunk"]
    assert itl.data.data_points[0].count == 4
    inflight = metrics["speedgate.replica_inflight"]
    assert {d.attributes["speedgate.pool"] for d in inflight.data.data_points} == {
        "m/fast", "m/standard"}


class _Collector(BaseHTTPRequestHandler):
    received: ClassVar[list[tuple[str, bytes]]] = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["content-length"]))
        type(self).received.append((self.path, body))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def collector():
    _Collector.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _Collector.received
    server.shutdown()
    server.server_close()


def _received(received):
    spans, metric_names = [], set()
    for path, body in received:
        if path == "/v1/traces":
            req = ExportTraceServiceRequest.FromString(body)
            spans += [s.name for rs in req.resource_spans for ss in rs.scope_spans
                      for s in ss.spans]
        elif path == "/v1/metrics":
            req = ExportMetricsServiceRequest.FromString(body)
            metric_names |= {x.name for rm in req.resource_metrics for sm in rm.scope_metrics
                             for x in sm.metrics}
    return spans, metric_names


@pytest.mark.parametrize("via_env", [False, True])
def test_otlp_http_export_of_spans_and_metrics(collector, monkeypatch, via_env):
    url, received = collector
    for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    if via_env:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", url)
        cfg = TelemetryConfig(service_name="sg-test")
    else:
        cfg = TelemetryConfig(service_name="sg-test", otlp_endpoint=url)
    m = GatewayMetrics(_pools())

    async def main():
        tel = Telemetry(cfg, registry=m.registry)
        await tel.start()
        rt = tel.start_request([(b"traceparent", TRACEPARENT.encode())])
        rt.attempt(pool="m/standard", tier="standard", replica="http://127.0.0.1:9001",
                   model="m-std", number=1).end("ok")
        rec = _finished_rec()
        rt.finish(rec)
        m.record_request(rec)
        await tel.shutdown()

    asyncio.run(main())
    spans, names = _received(received)
    assert sorted(spans) == ["chat m", "chat m-std"]
    assert {"gen_ai.server.request.duration", "gen_ai.server.time_to_first_token",
            "gen_ai.client.token.usage", "speedgate.requests"} <= names


def test_no_endpoint_no_export_and_no_span_cost():
    tel = Telemetry(TelemetryConfig(), registry=CollectorRegistry(), environ={})
    assert tel.bridge is None and tel.provider is None and not tel.tracing
    rt = tel.start_request([(b"traceparent", TRACEPARENT.encode())])
    assert rt.span is None and rt.trace_id == CLIENT_TRACE
    att = rt.attempt(pool="p", tier="t", replica="", model="m", number=1)
    assert att.headers() == {"traceparent": TRACEPARENT}
    # a malformed traceparent is forwarded as is but names no trace
    bad = tel.start_request([(b"traceparent", b"garbage")])
    assert bad.trace_id is None


def test_request_span_records_each_resume():
    exporter = InMemorySpanExporter()
    tel = Telemetry(TelemetryConfig(), span_exporter=exporter)
    rt = tel.start_request([], "chat")
    rec = _finished_rec()
    rec.resumes = [
        {"reason": "stall-timeout", "from_tier": "standard", "carried_chars": 30,
         "outcome": "resumed", "to_tier": "standard"},
        {"reason": "broken-stream", "from_tier": "standard", "carried_chars": 70,
         "outcome": "resumed", "to_tier": "fast"},
    ]
    rt.finish(rec)
    (req,) = exporter.get_finished_spans()
    assert req.attributes["speedgate.resumes"] == (
        "stall-timeout:resumed:standard", "broken-stream:resumed:fast")
    assert req.attributes["speedgate.resume.carried_chars"] == 100
