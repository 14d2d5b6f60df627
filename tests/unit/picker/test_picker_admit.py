"""The picker's decision path is the proxy's (``gateway.admit.path``), and its ext_proc stream
keeps one order, over a real gRPC channel on loopback: the key checked on the headers before
any body is kept, the body checks, KV fit, the agents' session ids, one pick per stream
finished exactly once, header values that are not latin-1, an unparseable response status."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest_asyncio
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc

from gateway.admit.auth import new_key
from gateway.config import GatewayConfig
from gateway.picker.grpc_server import PickerServer
from gateway.picker.runtime import PickerRuntime
from tests.unit.picker.test_picker_grpc import (
    ENDPOINTS,
    _body,
    _chat,
    _destination,
    _headers,
    _process,
    _response_headers,
)

KEY, DIGEST = new_key()


def _config() -> GatewayConfig:
    pool = {"served_model_name": "engine-m", "endpoints": ENDPOINTS}
    return GatewayConfig(
        health={"interval_s": 3600, "unhealthy_threshold": 5},
        models={"m": {"tiers": {"standard": pool}}},
        server={"max_body_bytes": 400_000, "max_json_depth": 16},
        auth={"keys": [{"id": "k", "hash": DIGEST, "limits": {"concurrent": 2}}]},
    )


@pytest_asyncio.fixture(loop_scope="function")
async def picker() -> AsyncIterator[tuple[PickerServer, ep_grpc.ExternalProcessorStub]]:
    server = PickerServer(PickerRuntime.build(_config()), "127.0.0.1", 0, max_endpoints=1)
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        yield server, ep_grpc.ExternalProcessorStub(channel)
    finally:
        await channel.close()
        await server.stop(0)


def _authed(path: str = "/v1/chat/completions", **extra: str | bytes) -> ep.ProcessingRequest:
    """Request headers with the key, and ``extra`` headers (a ``str`` goes as ``value``, the
    protocol's UTF-8 string field; ``bytes`` as ``raw_value``)."""
    req = _headers(path=path)
    hm = req.request_headers.headers
    hm.headers.add(key="authorization", raw_value=f"Bearer {KEY}".encode())
    for name, value in extra.items():
        name = name.replace("_", "-")
        if isinstance(value, bytes):
            hm.headers.add(key=name, raw_value=value)
        else:
            hm.headers.add(key=name, value=value)
    return req


def _status(out: list[ep.ProcessingResponse]) -> int:
    """The immediate response's status, or 200 for a pick."""
    last = out[-1] if out else ep.ProcessingResponse()
    if last.HasField("immediate_response"):
        return last.immediate_response.status.code
    assert _destination(out[0])[0], out
    return 200


async def test_bad_key_is_401_on_the_headers_before_the_body(picker) -> None:
    """No key: the 401 answers the headers message itself, before any body chunk is sent
    (the picker kept nothing of the body; it used to buffer and decode it all first)."""
    _, stub = picker
    answered = asyncio.Event()
    sent_body: list[bool] = []

    async def gen() -> AsyncIterator[ep.ProcessingRequest]:
        yield _headers()
        try:
            await asyncio.wait_for(answered.wait(), 5)
        except TimeoutError:
            sent_body.append(True)
            yield _body(b"x" * 300_000, eos=False)
            yield _body(_chat())

    out = []
    async for r in stub.Process(gen()):
        out.append(r)
        answered.set()
    assert not sent_body, "the 401 came only after the body"
    assert len(out) == 1 and out[0].immediate_response.status.code == 401
    assert json.loads(out[0].immediate_response.body)["error"]["code"] == "missing_api_key"


async def test_second_body_end_is_refused_and_the_pick_finished_once(picker) -> None:
    """A second ``request_body{end_of_stream}`` on one stream ends it (FAILED_PRECONDITION)
    instead of picking again; the first pick is finished, so a key with ``concurrent: 2``
    still runs 2 at once afterwards and no replica keeps an in-flight count."""
    server, stub = picker
    codes = []
    for reqs in ([_authed(), _body(_chat()), _body(_chat())],
                 [_authed(), _authed()]):  # request headers twice: refused too
        try:
            await _process(stub, reqs)
            codes.append(grpc.StatusCode.OK)
        except grpc.aio.AioRpcError as e:
            codes.append(e.code())
    rt = server.runtime
    await _until(lambda: rt.gate.limiter.inflight("k") == 0)  # type: ignore[attr-defined]

    picked = [asyncio.Event(), asyncio.Event()]
    statuses: list[int] = []

    async def hold(i: int) -> None:
        async def gen() -> AsyncIterator[ep.ProcessingRequest]:
            yield _authed()
            yield _body(_chat(f"hold {i}"))
            await asyncio.gather(*(p.wait() for p in picked))  # both held at once
        out = []
        async for r in stub.Process(gen()):
            out.append(r)
            if r.HasField("request_headers") or r.HasField("immediate_response"):
                picked[i].set()
        statuses.append(_status(out))

    await asyncio.wait_for(asyncio.gather(hold(0), hold(1)), 10)
    assert statuses == [200, 200]
    assert all(r.inflight == 0 for r in rt.pools.replicas())
    assert codes == [grpc.StatusCode.FAILED_PRECONDITION] * 2


async def _until(cond: Any, timeout_s: float = 5.0) -> bool:
    """``cond()`` became true within ``timeout_s`` (the stream's end settles after the
    client saw it)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not cond():
        if loop.time() > end:
            return False
        await asyncio.sleep(0.01)
    return True


async def test_header_values_beyond_latin1_are_read_not_crashed_on(picker) -> None:
    """A ``value`` (UTF-8 string field) outside latin-1 is read as its UTF-8 bytes, as the
    proxy reads them: a pick, and a clean 400 in the API's shape on the error path (it used
    to be gRPC UNKNOWN or a 500 ``internal picker error``)."""
    server, stub = picker
    out = await _process(stub, [_authed(x_request_id="r€", x_session_id="sess-€"),
                                _body(_chat())])
    assert _status(out) == 200
    out = await _process(stub, [_authed(x_request_id="r€", x_speedgate_tier="€"),
                                _body(b"{not json")])
    assert _status(out) == 400
    assert json.loads(out[-1].immediate_response.body)["error"]["type"] == (
        "invalid_request_error")
    out = await _process(stub, [_authed(path="/v1/messages", x_request_id="€"),
                                _body(b"[]")])
    assert _status(out) == 400 and json.loads(out[-1].immediate_response.body)["type"] == "error"
    assert all(r.inflight == 0 for r in server.runtime.pools.replicas())


async def test_unparseable_response_status_is_recorded_not_fatal(picker) -> None:
    """A response ``:status`` of ``abc``: the stream goes on (response headers answered,
    body passed, the pick finished), counted neither as a success nor a failure."""
    server, stub = picker
    hm = base_pb2.HeaderMap()
    hm.headers.add(key=":status", raw_value=b"abc")
    bad = ep.ProcessingRequest(response_headers=ep.HttpHeaders(headers=hm))
    out = await _process(stub, [_authed(), _body(_chat()), bad,
                                ep.ProcessingRequest(response_body=ep.HttpBody(
                                    body=b"{}", end_of_stream=True))])
    assert out[-2].HasField("response_headers") and out[-1].HasField("response_body")
    assert all(r.inflight == 0 and r.outlier.consecutive_failures == 0
               for r in server.runtime.pools.replicas())


async def test_picker_runs_the_body_checks(picker) -> None:
    """The proxy's body checks in picker mode: JSON nested past ``server.max_json_depth``
    and a sampling parameter of the wrong type are 400 before any pick."""
    _, stub = picker
    deep: Any = "x"
    for _ in range(40):
        deep = [deep]
    body = json.dumps({"model": "m", "max_tokens": 3, "metadata": {"d": deep},
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    out = await _process(stub, [_authed(), _body(body)])
    assert _status(out) == 400, out
    doc = json.loads(out[-1].immediate_response.body)
    assert "nests deeper than 16" in doc["error"]["message"]
    body = json.dumps({"model": "m", "max_tokens": 3, "temperature": "hot",
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    out = await _process(stub, [_authed(), _body(body)])
    assert _status(out) == 400
    assert json.loads(out[-1].immediate_response.body)["error"]["param"] == "temperature"


async def test_picker_routes_only_where_the_request_fits(picker) -> None:
    """KV fit in picker mode: replicas with known limits, a prompt longer than two of them
    goes to the third every time; one longer than all is 400 ``context_length_exceeded``."""
    server, stub = picker
    small, small2, large = server.runtime.pools.replicas()
    for r, n in ((small, 2048), (small2, 2048), (large, 65536)):
        r.max_model_len = n
    prompt = "word " * 4000
    for i in range(6):
        out = await _process(stub, [_authed(), _body(_chat(f"{i} {prompt}"))])
        assert _destination(out[0])[0] == large.url.split("://")[1]
    out = await _process(stub, [_authed(), _body(_chat("word " * 70_000))])
    assert _status(out) == 400
    assert json.loads(out[-1].immediate_response.body)["error"]["code"] == (
        "context_length_exceeded")


async def test_agent_session_header_gives_affinity(picker) -> None:
    """``X-Claude-Code-Session-Id`` names the session in picker mode as in the proxy: turns
    of unrelated conversations under one id land on one replica, and the picker records the
    session and its source."""
    server, stub = picker
    seen: set[str] = set()
    sessions: set[tuple[str | None, str | None]] = set()
    picker_obj = server.picker
    real_pick = picker_obj.pick

    async def spy(*args: Any, **kw: Any) -> Any:
        pick = await real_pick(*args, **kw)
        sessions.add((pick.rec.session_id, pick.rec.session_src))
        return pick

    picker_obj.pick = spy  # type: ignore[method-assign]
    for i in range(8):
        out = await _process(stub, [_authed(x_claude_code_session_id="cc-1"),
                                    _body(_chat(f"unrelated task {i} " * 20))])
        seen.add(_destination(out[0])[0])
    assert sessions == {("cc-1", "claude-code")}
    assert len(seen) == 1


async def test_picker_sends_a_cap_that_does_not_fit_lowered(picker) -> None:
    """Picker mode lowers an output cap as the proxy does: the prompt fits a 4,096-token
    replica, prompt + ``max_tokens`` 32,000 does not, so the body sent upstream has no
    ``max_tokens`` and the client's response carries ``x-speedgate-output-cap``."""
    server, stub = picker
    for r in server.runtime.pools.replicas():
        r.max_model_len = 4096
    body = json.dumps({"model": "m", "max_tokens": 32_000,
                       "messages": [{"role": "user", "content": "word " * 3000}]}).encode()
    out = await _process(stub, [_authed(), _body(body), _response_headers(200, None)])
    assert _destination(out[0])[0]
    sent = json.loads(b"".join(r.request_body.response.body_mutation.streamed_response.body
                               for r in out if r.HasField("request_body")))
    assert sent["messages"] and "max_tokens" not in sent
    headers = {h.header.key: h.header.raw_value.decode()
               for h in out[-1].response_headers.response.header_mutation.set_headers}
    assert headers["x-speedgate-output-cap"].startswith("lowered; asked=32000; prompt=")
    assert headers["x-speedgate-output-cap"].endswith("; max_model_len=4096")
