"""What the engines consumed is recorded even when no attempt answered: a Responses engine that
fails every request with ``response.failed`` before any content, reporting 20 input tokens each
time, is retried on the other replica and answered 502; the request's usage holds the tokens of
both attempts and its cost their price (the per-session totals say so)."""

from __future__ import annotations

import orjson
from aiohttp import web

from tests.unit.upstream.engine_double import gateway_on, sse

USAGE = {"input_tokens": 20, "output_tokens": 0, "total_tokens": 20,
         "input_tokens_details": {"cached_tokens": 0}}


def _failed() -> bytes:
    resp = {"id": "resp_x", "object": "response", "model": "m", "status": "failed",
            "output": [], "usage": USAGE,
            "error": {"code": "server_error", "message": "engine fell over"}}
    return (b"event: response.failed\ndata: "
            + orjson.dumps({"type": "response.failed", "response": resp, "sequence_number": 1})
            + b"\n\n")


async def test_tokens_of_failed_attempts_are_recorded_and_charged() -> None:
    async def script(request: web.Request, i: int) -> web.StreamResponse:
        return await sse(request, [_failed()])

    async with gateway_on(script, replicas=2,
                          pool={"prices": {"input_per_mtok_usd": 1_000_000}}) as bench:
        r = await bench.client.post("/v1/responses", headers={"x-session-id": "s1"},
                                    json={"model": "m", "input": "hi", "stream": True})
        totals = await bench.state.usage.get_session(None, "s1")
    assert r.status_code == 502 and "engine fell over" in r.text
    assert len(bench.seen) == 2  # asked again on the other replica
    assert (totals.requests, totals.errors) == (1, 1)
    assert totals.input_tokens == 40 and totals.output_tokens == 0
    assert totals.cost_usd == 40.0  # 40 tokens at 1 USD per token
