"""Tool-call deltas without ``index`` (Gemini's and Ollama's OpenAI-compatible streams send each
call whole, at position 0 of its chunk, told apart only by ``id``): a JSON answer the gateway
assembles from the stream has one call per ``id``, each with its own arguments, as the official
client reads them."""

from __future__ import annotations

import openai
import orjson
from aiohttp import web

from gateway.protocols.openai.assemble import assemble
from tests.unit.upstream.engine_double import chunk, gateway_on, sse

CALLS = [
    {"id": "call_a", "type": "function",
     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
    {"id": "call_b", "type": "function",
     "function": {"name": "get_time", "arguments": '{"zone": "CET"}'}},
]
USAGE = {"prompt_tokens": 7, "completion_tokens": 9, "total_tokens": 16}


def _events() -> list[bytes]:
    return [chunk({"role": "assistant", "content": ""}),
            chunk({"tool_calls": [CALLS[0]]}), chunk({"tool_calls": [CALLS[1]]}),
            chunk({}, finish="tool_calls"), chunk(choices=False, usage=USAGE),
            b"data: [DONE]\n\n"]


def _payload(ev: bytes) -> bytes:
    return ev.removeprefix(b"data: ").rstrip()


def test_calls_without_index_are_told_apart_by_id() -> None:
    doc = assemble([_payload(e) for e in _events()[:-1]], None, chat=True)
    assert doc["choices"][0]["message"]["tool_calls"] == CALLS


def test_a_call_without_index_continued_by_id_or_by_neither() -> None:
    parts = [
        chunk({"tool_calls": [{"id": "call_a", "type": "function",
                               "function": {"name": "f", "arguments": '{"a": '}}]}),
        chunk({"tool_calls": [{"function": {"arguments": "1"}}]}),  # no id: the last call
        chunk({"tool_calls": [{"id": "call_b", "function": {"name": "g", "arguments": "{}"}}]}),
        chunk({"tool_calls": [{"id": "call_a", "function": {"arguments": "}"}}]}),
        chunk({}, finish="tool_calls"),
    ]
    calls = assemble([_payload(e) for e in parts], None, chat=True)["choices"][0]["message"][
        "tool_calls"]
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("call_a", "f", '{"a": 1}'), ("call_b", "g", "{}")]


async def test_openai_client_gets_both_calls_of_an_upstream_without_index() -> None:
    async def script(request: web.Request, i: int) -> web.StreamResponse:
        return await sse(request, _events())

    async with gateway_on(script, replicas=1) as bench:
        client = openai.AsyncOpenAI(base_url="http://gw/v1", api_key="unused", max_retries=0,
                                    http_client=bench.client)
        done = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "weather and time?"}],
            tools=[{"type": "function", "function": {"name": n, "parameters": {}}}
                   for n in ("get_weather", "get_time")])
    calls = done.choices[0].message.tool_calls
    assert calls is not None and [(c.id, c.function.name, orjson.loads(c.function.arguments))
                                  for c in calls] == [
        ("call_a", "get_weather", {"city": "Paris"}), ("call_b", "get_time", {"zone": "CET"})]
    assert done.choices[0].finish_reason == "tool_calls"
