"""Responses engines as they are, not as vLLM is: one that names its responses itself (it
ignores the ``request_id`` the gateway sends) and one whose ``response.completed`` lists no
``output`` after it streamed the items. The client sees one id, the gateway's, which ``GET``
and ``cancel`` know while the response runs (the engine is told its own id); and what is
stored for ``previous_response_id`` is what the client received."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from aiohttp import web

from tests.e2e.protocol_helpers import parse_events
from tests.unit.upstream.engine_double import gateway_on

ENGINE_ID = "resp_engine0000000000000000000001"
ITEM = {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
        "content": [{"type": "output_text", "text": "Paris.", "annotations": []}]}
USAGE = {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7,
         "input_tokens_details": {"cached_tokens": 0},
         "output_tokens_details": {"reasoning_tokens": 0}}


def _event(kind: str, **fields: Any) -> bytes:
    return (b"event: " + kind.encode() + b"\ndata: "
            + orjson.dumps({"type": kind, **fields}) + b"\n\n")


def _response(status: str, output: list[Any], usage: Any = None) -> dict[str, Any]:
    return {"id": ENGINE_ID, "object": "response", "created_at": 1, "model": "m",
            "status": status, "output": output, "usage": usage}


def _head() -> list[bytes]:
    added = {**ITEM, "status": "in_progress", "content": []}
    return [
        _event("response.created", response=_response("in_progress", []), sequence_number=0),
        _event("response.output_item.added", output_index=0, item=added, sequence_number=1),
        _event("response.content_part.added", item_id="msg_1", output_index=0,
               content_index=0, part={"type": "output_text", "text": ""}, sequence_number=2),
        _event("response.output_text.delta", item_id="msg_1", output_index=0, content_index=0,
               delta="Paris.", sequence_number=3),
    ]


def _tail() -> list[bytes]:
    return [
        _event("response.output_text.done", item_id="msg_1", output_index=0, content_index=0,
               text="Paris.", sequence_number=4),
        _event("response.output_item.done", output_index=0, item=ITEM, sequence_number=5),
        # the items were streamed: this engine lists none in its terminal event
        _event("response.completed", response=_response("completed", [], USAGE),
               sequence_number=6),
    ]


async def test_completed_without_output_stores_what_the_client_received() -> None:
    async def script(request: web.Request, i: int) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for ev in _head() + _tail():
            await resp.write(ev)
        await resp.write_eof()
        return resp

    async with gateway_on(script, replicas=1) as bench:
        r = await bench.client.post("/v1/responses", json={
            "model": "m", "input": "Capital of France?", "stream": True})
        assert r.status_code == 200
        events = parse_events(r.content)
        rid = events[0][1]["response"]["id"]
        r2 = await bench.client.post("/v1/responses", json={
            "model": "m", "input": "And of Italy?", "previous_response_id": rid, "stream": True})
        assert r2.status_code == 200, r2.text
        stored = (await bench.client.get(f"/v1/responses/{rid}")).json()
    second = bench.seen[1].doc["input"]
    assert [i.get("role") for i in second] == ["user", "assistant", "user"]
    assert second[1]["content"][0]["text"] == "Paris."
    assert stored["output"] == [ITEM]


async def test_engine_named_response_is_the_gateways_to_the_client_and_cancellable() -> None:
    cancels: list[str] = []
    told, running = asyncio.Event(), asyncio.Event()

    async def script(request: web.Request, i: int) -> web.StreamResponse:
        if request.path.endswith("/cancel"):
            cancels.append(request.path)
            told.set()
            return web.json_response(_response("cancelled", []))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for ev in _head():
            await resp.write(ev)
        running.set()
        await told.wait()  # runs until its cancel
        await resp.write(_event("response.failed", response=_response("cancelled", [])))
        await resp.write_eof()
        return resp

    async with gateway_on(script, replicas=1) as bench:
        responses = next(r.endpoint.protocol for r in bench.app.api.router.routes
                         if getattr(r, "path", None) == "/v1/responses")
        run = asyncio.create_task(bench.client.post("/v1/responses", json={
            "model": "m", "input": "Capital of France?", "stream": True}))
        await asyncio.wait_for(running.wait(), 10)
        (rid,) = responses.state.flights
        got = await bench.client.get(f"/v1/responses/{rid}")
        assert got.status_code == 200 and got.json()["status"] == "in_progress"
        cancel = await bench.client.post(f"/v1/responses/{rid}/cancel")
        assert cancel.status_code == 200 and cancel.json()["status"] == "cancelled"
        r = await asyncio.wait_for(run, 10)
    assert cancels == [f"/v1/responses/{ENGINE_ID}/cancel"]  # the engine is told its own id
    events = parse_events(r.content)
    ids = {doc["response"]["id"] for _, doc in events if "response" in doc}
    assert ids == {rid}  # the client's id is the one GET and cancel know
    assert ENGINE_ID.encode() not in r.content
