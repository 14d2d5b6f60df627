"""Trailing slashes, the code of an engine 404, the Python
SDK's read timeout, and what the text access log says. The gateway app in-process in front of
scripted engines (``tests.unit.upstream.engine_double``)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import orjson
import pytest
from aiohttp import web

from gateway.errors import parse_engine_error
from tests.unit.upstream.engine_double import chunk, completion, gateway_on

CHAT = "/v1/chat/completions"
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def _ok(request: web.Request, i: int) -> web.StreamResponse:
    return web.json_response(completion())


# --- trailing slash --------------------------------------------------------------------------


async def test_item4_trailing_slash_is_served_never_redirected_to_the_clients_host():
    async with gateway_on(_ok) as bench:
        evil = {"host": "evil.example"}
        r = await bench.client.post(CHAT + "/", json=BODY, headers=evil)
        assert r.status_code == 200, r.text
        assert "location" not in r.headers
        assert r.json()["choices"][0]["message"]["content"] == "Hello"
        r = await bench.client.get("/v1/models/", headers=evil)
        assert r.status_code == 200 and r.json()["object"] == "list"
        r = await bench.client.get("/healthz/", headers=evil)
        assert r.status_code == 200
        r = await bench.client.post("/v1/nothing/", json=BODY, headers=evil)
        assert r.status_code == 404 and "location" not in r.headers
        assert r.json()["error"]["code"] == "not_found"


# --- engine 404 ------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", ["nested", "flat"])
def test_item4_engine_404_gets_a_code(shape: str):
    inner = {"message": "The model `x` does not exist.", "type": "NotFoundError", "param": None,
             "code": 404}
    doc = {"error": inner} if shape == "nested" else {"object": "error", **inner}
    err = parse_engine_error(404, orjson.dumps(doc))
    assert (err.status, err.code, err.type) == (404, "not_found", "invalid_request_error")
    assert parse_engine_error(404, b"").code == "not_found"
    assert parse_engine_error(418, b"").code == "http_418"
    named = {"error": {"message": "too long", "code": "context_length_exceeded"}}
    assert parse_engine_error(400, orjson.dumps(named)).code == "context_length_exceeded"


async def test_item4_engine_404_reaches_the_client_with_a_code():
    async def script(request: web.Request, i: int) -> web.StreamResponse:
        return web.json_response({"error": {"message": "The model `m` does not exist.",
                                            "type": "NotFoundError", "param": None,
                                            "code": 404}}, status=404)

    async with gateway_on(script) as bench:
        r = await bench.client.post(CHAT, json=BODY)
        assert r.status_code == 404
        assert r.json()["error"]["code"] == "not_found"
        assert len(bench.seen) == 1  # the client's fault: not retried


# --- x-stainless-read-timeout ----------------------------------------------------------------


async def test_item4_stainless_read_timeout_bounds_the_wait_for_the_first_byte():
    """The Python SDK's per-read timeout: no byte reaches the client before the JSON body, so
    it bounds the whole wait (and no other replica is tried once the client stopped waiting)."""

    async def script(request: web.Request, i: int) -> web.StreamResponse:
        await asyncio.sleep(3)
        return web.json_response(completion())

    async with gateway_on(script) as bench:
        t0 = time.monotonic()
        r = await bench.client.post(CHAT, json=BODY, headers={"x-stainless-read-timeout": "0.5"})
        assert r.status_code == 504, r.text
        assert time.monotonic() - t0 < 2.5
        assert "read timeout" in r.json()["error"]["message"]
        assert len(bench.seen) == 1
        assert bench.failures() == [0, 0]  # the client's timeout, not the replica's fault


def _paced(gaps: list[float]):
    """A stream whose content events come after ``gaps`` (seconds) one after another."""

    async def script(request: web.Request, i: int) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(chunk({"role": "assistant", "content": ""}))
        for n, gap in enumerate(gaps):
            await asyncio.sleep(gap)
            await resp.write(chunk({"content": f"t{n} "}))
        await resp.write(chunk({}, finish="stop") + b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    return script


async def test_item4_stainless_read_timeout_is_not_a_total_timeout():
    async with gateway_on(_paced([0.0] + [0.25] * 8)) as bench:
        t0 = time.monotonic()
        r = await bench.client.post(CHAT, json=BODY | {"stream": True},
                                    headers={"x-stainless-read-timeout": "1"})
        assert time.monotonic() - t0 > 1.5  # longer than the read timeout, yet complete
        assert r.status_code == 200 and r.content.endswith(b"data: [DONE]\n\n")


async def test_item4_stainless_read_timeout_bounds_the_stall_between_events():
    async with gateway_on(_paced([0.0, 2.0])) as bench:
        r = await bench.client.post(CHAT, json=BODY | {"stream": True},
                                    headers={"x-stainless-read-timeout": "0.5"})
        assert r.status_code == 200
        last = orjson.loads(r.content.rstrip(b"\n").split(b"\n\n")[-1][6:])
        assert last["error"]["code"] == "upstream_timeout"
        assert "stall timeout after 0.5s" in last["error"]["message"]


# --- the text access log ---------------------------------------------------------------------


def _access_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "speedgate.access"]


async def test_item4_access_log_text_has_cost_and_replica_name(caplog):
    caplog.set_level(logging.INFO, logger="speedgate.access")
    prices = {"prices": {"input_per_mtok_usd": 1000, "output_per_mtok_usd": 2000}}
    async with gateway_on(_ok, pool=prices) as bench:
        r = await bench.client.post(CHAT, json=BODY)
        assert r.status_code == 200
    (line,) = _access_lines(caplog)
    assert "cost_usd=0.01100000" in line  # 7 × 1000 + 2 × 2000 USD per 1M tokens
    assert "replica=m/standard/" in line and "127.0.0.1" not in line


@pytest.mark.slow
async def test_item4_access_log_499_before_headers_names_the_tier_and_replica_tried(caplog):
    """A client gone while the engine was still working: the line names what was tried."""
    caplog.set_level(logging.INFO, logger="speedgate.access")
    arrived = asyncio.Event()

    async def script(request: web.Request, i: int) -> web.StreamResponse:
        arrived.set()
        await asyncio.sleep(10)
        return web.json_response(completion())

    async with gateway_on(script) as bench:
        sent: list[dict[str, Any]] = []
        messages = [{"type": "http.request", "body": orjson.dumps(BODY), "more_body": False}]

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop(0)
            await arrived.wait()
            return {"type": "http.disconnect"}

        async def send(msg: dict[str, Any]) -> None:
            sent.append(msg)

        scope = {"type": "http", "method": "POST", "path": CHAT, "raw_path": CHAT.encode(),
                 "query_string": b"", "root_path": "", "scheme": "http", "http_version": "1.1",
                 "headers": [(b"content-type", b"application/json"), (b"host", b"gw")],
                 "client": ("127.0.0.1", 5), "server": ("127.0.0.1", 80)}
        await asyncio.wait_for(bench.app(scope, receive, send), 5)
        assert sent == []  # nothing to send to a client that left
    (line,) = _access_lines(caplog)
    assert "status=499" in line
    assert "tier=standard" in line and "replica=m/standard/" in line
