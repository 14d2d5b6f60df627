"""``assemble``: every kind of delta a chat chunk carries reaches the JSON answer (text,
reasoning under either key, tool calls cut across chunks, logprobs, the finish), including
chunks that carry only one of them (the assembler skips what a chunk lacks)."""

from __future__ import annotations

import orjson

from gateway.protocols.openai.assemble import assemble


def _chunk(delta: dict, finish: str | None = None, logprobs: dict | None = None) -> bytes:
    return orjson.dumps({
        "id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": delta, "logprobs": logprobs,
                     "finish_reason": finish}],
    })  # fmt: skip


def test_every_delta_kind_is_assembled() -> None:
    relayed = [
        _chunk({"role": "assistant", "content": ""}),
        _chunk({"reasoning_content": "think "}),
        _chunk({"reasoning": "more"}),
        _chunk({"content": "Hello"}, logprobs={"content": [{"token": "Hello", "logprob": -0.1}]}),
        _chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                "function": {"name": "run", "arguments": '{"a"'}}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}),
        _chunk({}, finish="tool_calls"),
    ]
    doc = assemble(relayed, None, chat=True)
    choice = doc["choices"][0]
    msg = choice["message"]
    assert msg["content"] == "Hello"
    assert msg["reasoning"] == "think more"
    assert msg["tool_calls"] == [{"id": "call_1", "type": "function",
                                  "function": {"name": "run", "arguments": '{"a": 1}'}}]
    assert choice["logprobs"] == {"content": [{"token": "Hello", "logprob": -0.1}]}
    assert choice["finish_reason"] == "tool_calls"


def test_a_null_tool_calls_delta_is_no_call() -> None:
    doc = assemble([_chunk({"content": "x", "tool_calls": None}), _chunk({}, finish="stop")],
                   None, chat=True)
    assert "tool_calls" not in doc["choices"][0]["message"]
    assert doc["choices"][0]["message"]["content"] == "x"
