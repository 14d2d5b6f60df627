"""The picker's ext_proc and health services over a real gRPC channel on loopback, driven
with the messages Envoy sends (``envoy.service.ext_proc.v3``): the pick as header and
metadata, body chunks, the subset hint, immediate errors, buffered mode, the served endpoint
fed back to the in-flight counts and outlier ejection."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
import pytest_asyncio
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2 as pm
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.config import GatewayConfig
from gateway.picker import messages as msg
from gateway.picker.grpc_server import EXT_PROC_SERVICE, PickerServer
from gateway.picker.runtime import PickerRuntime

ENDPOINTS = ["http://127.0.0.1:9", "http://127.0.0.2:9", "http://127.0.0.3:9"]


def _config() -> GatewayConfig:
    pool = {"served_model_name": "engine-m", "endpoints": ENDPOINTS,
            "outlier": {"consecutive_failures": 2}}
    return GatewayConfig(
        health={"interval_s": 3600, "unhealthy_threshold": 5},  # probes never mark these down
        models={"m": {"tiers": {"standard": pool}}},
        server={"max_body_bytes": 400_000},
    )


@pytest_asyncio.fixture(loop_scope="function")
async def picker() -> AsyncIterator[tuple[PickerServer, ep_grpc.ExternalProcessorStub,
                                          grpc.aio.Channel]]:
    server = PickerServer(PickerRuntime.build(_config()), "127.0.0.1", 0, max_endpoints=2)
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        yield server, ep_grpc.ExternalProcessorStub(channel), channel
    finally:
        await channel.close()
        await server.stop(0)


def _headers(path: str = "/v1/chat/completions", mode: int = pm.ProcessingMode.FULL_DUPLEX_STREAMED,
             subset: list[str] | None = None, eos: bool = False) -> ep.ProcessingRequest:
    hm = base_pb2.HeaderMap()
    for k, v in ((":path", path), (":method", "POST"), ("content-type", "application/json"),
                 ("x-request-id", "req-1")):
        hm.headers.add(key=k, raw_value=v.encode())
    req = ep.ProcessingRequest(request_headers=ep.HttpHeaders(headers=hm, end_of_stream=eos))
    req.protocol_config.request_body_mode = mode  # type: ignore[assignment]
    req.protocol_config.response_body_mode = mode  # type: ignore[assignment]
    if subset is not None:
        lst = req.metadata_context.filter_metadata[msg.SUBSET_NAMESPACE].fields[msg.SUBSET]
        lst.list_value.values.extend([_str(s) for s in subset])
    return req


def _str(s: str):
    from google.protobuf import struct_pb2
    return struct_pb2.Value(string_value=s)


def _body(data: bytes, eos: bool = True) -> ep.ProcessingRequest:
    return ep.ProcessingRequest(request_body=ep.HttpBody(body=data, end_of_stream=eos))


def _response_headers(status: int, served: str | None) -> ep.ProcessingRequest:
    hm = base_pb2.HeaderMap()
    hm.headers.add(key=":status", raw_value=str(status).encode())
    hm.headers.add(key="content-type", raw_value=b"application/json")
    req = ep.ProcessingRequest(response_headers=ep.HttpHeaders(headers=hm))
    if served is not None:
        req.metadata_context.filter_metadata[msg.LB_NAMESPACE].fields[msg.SERVED].string_value = (
            served)
    return req


def _chat(content: str = "hi") -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": content}],
                       "max_tokens": 3}).encode()


async def _process(stub: ep_grpc.ExternalProcessorStub,
                   reqs: list[ep.ProcessingRequest]) -> list[ep.ProcessingResponse]:
    async def gen() -> AsyncIterator[ep.ProcessingRequest]:
        for r in reqs:
            yield r
    return [r async for r in stub.Process(gen())]


def _destination(resp: ep.ProcessingResponse) -> tuple[str, str]:
    """(header value, envoy.lb metadata value) of a pick."""
    common = (resp.request_headers.response if resp.HasField("request_headers")
              else resp.request_body.response)
    header = next(h.header.raw_value.decode() for h in common.header_mutation.set_headers
                  if h.header.key == msg.DESTINATION)
    meta = resp.dynamic_metadata.fields[msg.LB_NAMESPACE].struct_value.fields[msg.DESTINATION]
    return header, meta.string_value


async def test_health_services(picker) -> None:
    _, _, channel = picker
    health = health_pb2_grpc.HealthStub(channel)
    for name in ("liveness", "readiness", EXT_PROC_SERVICE):
        r = await health.Check(health_pb2.HealthCheckRequest(service=name))
        assert r.status == health_pb2.HealthCheckResponse.SERVING, name
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await health.Check(health_pb2.HealthCheckRequest(service="nope"))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


async def test_pick_as_header_and_metadata_then_the_body_in_chunks(picker) -> None:
    server, stub, _ = picker
    body = _chat("z" * 150_000)
    out = await _process(stub, [_headers(), _body(body[:70_000], eos=False),
                                _body(body[70_000:])])
    header, meta = _destination(out[0])
    assert header == meta
    first, second = header.split(",")  # max_endpoints=2: the router's choice, then another
    assert first != second and {first, second} <= {"127.0.0.1:9", "127.0.0.2:9", "127.0.0.3:9"}
    chunks = [r.request_body.response.body_mutation.streamed_response for r in out[1:]]
    assert len(chunks) == 3 and all(len(c.body) <= 62_000 for c in chunks)
    assert [c.end_of_stream for c in chunks] == [False, False, True]
    sent = json.loads(b"".join(c.body for c in chunks))
    assert sent["model"] == "engine-m"  # the engine's name, as the proxy sends it
    assert sent["messages"][0]["content"] == "z" * 150_000
    # the stream is over: no in-flight count left behind
    assert all(r.inflight == 0 for r in server.runtime.pools.replicas())


async def test_subset_hint_is_honoured_and_an_empty_one_is_503(picker) -> None:
    _, stub, _ = picker
    for _ in range(3):
        out = await _process(stub, [_headers(subset=["127.0.0.3:9"]), _body(_chat())])
        assert _destination(out[0]) == ("127.0.0.3:9", "127.0.0.3:9")
    out = await _process(stub, [_headers(subset=["10.9.9.9:80"]), _body(_chat())])
    assert len(out) == 1 and out[0].immediate_response.status.code == 503
    doc = json.loads(out[0].immediate_response.body)
    assert doc["error"]["type"] == "server_error"


async def test_bad_body_is_400_in_the_protocol_shape(picker) -> None:
    _, stub, _ = picker
    out = await _process(stub, [_headers(), _body(b"{not json")])
    assert out[0].immediate_response.status.code == 400
    assert "error" in json.loads(out[0].immediate_response.body)
    out = await _process(stub, [_headers(path="/v1/messages"), _body(b"[]")])
    doc = json.loads(out[0].immediate_response.body)
    assert out[0].immediate_response.status.code == 400 and doc["type"] == "error"  # Anthropic's
    out = await _process(stub, [_headers(path="/v1/responses"), _body(_chat())])
    assert out[0].immediate_response.status.code == 404


async def test_body_over_the_limit_is_413_at_once(picker) -> None:
    _, stub, _ = picker
    out = await _process(stub, [_headers(), _body(b"x" * 300_000, eos=False),
                                _body(b"x" * 300_000)])
    assert len(out) == 1 and out[0].immediate_response.status.code == 413


async def test_buffered_mode_picks_with_the_body(picker) -> None:
    _, stub, _ = picker
    out = await _process(stub, [_headers(mode=pm.ProcessingMode.BUFFERED), _body(_chat())])
    assert out[0].HasField("request_headers")
    assert not out[0].request_headers.response.header_mutation.set_headers
    header, meta = _destination(out[1])
    assert header == meta
    mutated = json.loads(out[1].request_body.response.body_mutation.body)
    assert mutated["model"] == "engine-m"


async def test_served_endpoint_holds_the_slot_and_5xx_counts_against_it(picker) -> None:
    """Envoy retried onto the second endpoint of the list: the first is charged a failure,
    the second holds the in-flight slot until the response ends and is charged its 5xx."""
    server, stub, _ = picker
    by_ep = {msg_ep: r for r in server.runtime.pools.replicas()
             for msg_ep in [r.url.split("://")[1]]}

    seen: dict[str, Any] = {}
    picked, answered = asyncio.Event(), asyncio.Event()

    async def gen() -> AsyncIterator[ep.ProcessingRequest]:
        yield _headers()
        yield _body(_chat())
        await picked.wait()  # as Envoy: the response comes after the pick
        yield _response_headers(503, seen["second"])
        await answered.wait()
        yield ep.ProcessingRequest(response_body=ep.HttpBody(body=b"{}", end_of_stream=True))

    out = []
    async for r in stub.Process(gen()):
        out.append(r)
        if r.HasField("request_headers"):
            header, _ = _destination(r)
            seen["first"], seen["second"] = header.split(",")
            picked.set()
        if r.HasField("response_headers"):
            seen["inflight"] = by_ep[seen["second"]].inflight
            answered.set()
    first, second = by_ep[seen["first"]], by_ep[seen["second"]]
    assert seen["inflight"] == 1  # held by the replica that served
    assert first.outlier.consecutive_failures == 1
    assert second.outlier.consecutive_failures == 1
    assert first.inflight == second.inflight == 0
    added = {h.header.key: h.header.raw_value.decode()
             for h in out[-2].response_headers.response.header_mutation.set_headers}
    assert added["x-speedgate-replica"] == second.name
    assert added["x-speedgate-tier"] == "standard"
