"""A Responses answer is stored before the client has it: the store's write completes before
the bytes carrying the final response object (a stream's ``response.completed``, a JSON body)
are handed to the server, so a next turn (``previous_response_id``) sent the moment the client
reads them finds it, whichever gateway process it reaches. Told by the order of events at the
ASGI ``send`` and in a store whose write is slow (a test double), not by timing luck."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
import pytest
from aiohttp import web

from gateway.protocols.responses.store import MemoryResponseStore
from tests.unit.upstream.engine_double import gateway_on, sse


def _response(doc: dict[str, Any], status: str) -> dict[str, Any]:
    out = [{"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": "Hello", "annotations": []}]}]
    return {"id": doc.get("request_id") or "resp_engine", "object": "response",
            "created_at": 1, "model": "m", "status": status,
            "output": out if status == "completed" else [],
            "usage": {"input_tokens": 3, "output_tokens": 1, "total_tokens": 4}}


async def _engine(request: web.Request, replica: int) -> web.StreamResponse:
    doc = orjson.loads(await request.read())
    if not doc.get("stream"):
        return web.json_response(_response(doc, "completed"))

    def event(kind: str, seq: int, **data: Any) -> bytes:
        body = orjson.dumps({"type": kind, "sequence_number": seq, **data})
        return b"event: " + kind.encode() + b"\ndata: " + body + b"\n\n"

    return await sse(request, [
        event("response.created", 0, response=_response(doc, "in_progress")),
        event("response.output_text.delta", 1, item_id="msg_1", output_index=0,
              content_index=0, delta="Hello", logprobs=[]),
        event("response.completed", 2, response=_response(doc, "completed")),
    ])


def _recording(app: Any, log: list[str]) -> Any:
    """``app`` with every body message it sends noted in ``log`` (``sent:final`` for the one
    that carries the final response object, ``sent`` otherwise)."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        async def noting_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body" and message.get("body"):
                body = message["body"]
                final = b"response.completed" in body or b'"status":"completed"' in body
                log.append("sent:final" if final else "sent")
            await send(message)

        await app(scope, receive, noting_send)

    return wrapped


@pytest.mark.parametrize("stream", [True, False])
async def test_the_response_is_stored_before_the_client_gets_its_end(
    stream: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    log: list[str] = []
    put = MemoryResponseStore.put

    async def slow_put(self: MemoryResponseStore, record: dict[str, Any]) -> bool:
        await asyncio.sleep(0.05)  # a store round trip (Redis) the relay must wait for
        ok = await put(self, record)
        log.append("stored")
        return ok

    monkeypatch.setattr(MemoryResponseStore, "put", slow_put)
    async with gateway_on(_engine, replicas=1) as bench:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_recording(bench.app, log)),
                                     base_url="http://gw", timeout=30) as client:
            r = await client.post("/v1/responses",
                                  json={"model": "m", "input": "hi", "stream": stream})
            assert r.status_code == 200
            assert log.count("stored") == 1 and "sent:final" in log, log
            assert log.index("stored") < log.index("sent:final"), log
            first = (orjson.loads(r.text.split("event: response.completed\ndata: ")[1]
                                  .split("\n")[0])["response"] if stream else r.json())
            nxt = await client.post("/v1/responses", json={
                "model": "m", "input": "again", "previous_response_id": first["id"]})
            assert nxt.status_code == 200, nxt.text
    # the next turn's engine request carried the first turn's answer
    assert "Hello" in orjson.dumps(bench.seen[-1].doc["input"]).decode()
