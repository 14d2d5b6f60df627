"""An engine's OpenAI-shaped ``data: {"error": ...}`` in the middle of a Messages stream (a
generic error path of an OpenAI-compatible server) reaches the Anthropic client as one
``event: error`` carrying the engine's message: the official client raises with it."""

from __future__ import annotations

import anthropic
import httpx2  # the anthropic SDK's own httpx
import orjson
import pytest
from aiohttp import web

from tests.e2e.protocol_helpers import parse_events
from tests.unit.upstream.engine_double import gateway_on, sse

MESSAGE = "CUDA out of memory while decoding"


def _event(kind: str, doc: dict) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **doc}) + b"\n\n"


EVENTS = [
    _event("message_start", {"message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": 0}}}),
    _event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
    _event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "Hel"}}),
    b"data: " + orjson.dumps({"error": {"message": MESSAGE, "type": "InternalServerError",
                                        "code": 500}}) + b"\n\n",
]


@pytest.mark.parametrize("resume", [True, False], ids=["resume-on", "resume-off"])
async def test_openai_shaped_error_mid_messages_stream_is_one_anthropic_error(resume: bool
                                                                             ) -> None:
    async def script(request: web.Request, i: int) -> web.StreamResponse:
        return await sse(request, EVENTS)

    async with gateway_on(script, replicas=1, pool={"resume": {"enabled": resume}}) as bench:
        r = await bench.client.post("/v1/messages", json={
            "model": "m", "max_tokens": 8, "stream": True,
            "messages": [{"role": "user", "content": "hi"}]})
        http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=bench.app),
                                  base_url="http://gw")
        client = anthropic.AsyncAnthropic(base_url="http://gw", api_key="unused",
                                          max_retries=0, http_client=http)
        with pytest.raises(anthropic.APIStatusError) as raised:
            async with client.messages.stream(
                    model="m", max_tokens=8,
                    messages=[{"role": "user", "content": "hi"}]) as s:
                async for _ in s:
                    pass
        await http.aclose()
    events = parse_events(r.content)
    assert [name for name, _ in events] == [
        "message_start", "content_block_start", "content_block_delta", "error"]
    (error,) = [doc for name, doc in events if name == "error"]
    assert error["type"] == "error" and MESSAGE in error["error"]["message"]
    assert MESSAGE in str(raised.value)
