"""``assemble`` is total: a table of chunk sequences (vLLM's own, and what other servers and
proxies send) and the non-stream document vLLM builds for them (``vllm/entrypoints/openai/
chat_completion/serving.py`` and ``completion/serving.py``, 0.32): every field assembled as
vLLM does or passed through, ``null`` anywhere tolerated."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.protocols.openai.assemble import assemble

HEAD = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}


def chat(*choices: dict[str, Any], **top: Any) -> dict[str, Any]:
    """One chat chunk of ``choices`` (index 0 unless given) with top-level fields ``top``."""
    return {**HEAD, "choices": [{"index": 0, **c} for c in choices], **top}


def text(*choices: dict[str, Any], **top: Any) -> dict[str, Any]:
    """One completions chunk."""
    return {**HEAD, "object": "text_completion",
            "choices": [{"index": 0, **c} for c in choices], **top}


def run(chunks: list[dict[str, Any]], is_chat: bool = True) -> dict[str, Any]:
    return assemble([orjson.dumps(c) for c in chunks], None, chat=is_chat)


def call(name: str | None, args: str, **extra: Any) -> dict[str, Any]:
    return {"delta": {"tool_calls": [{"index": 0, "function": {"name": name, "arguments": args},
                                      **extra}]}}


CASES: list[tuple[str, list[dict[str, Any]], bool, dict[str, Any]]] = [
    # a name resent on every delta of the call (vLLM sends it on the first only)
    ("tool-name-repeated", [
        chat({"delta": {"role": "assistant", "content": ""}}),
        chat(call("read_file", "", id="call_1", type="function")),
        chat(call("read_file", '{"path"')),
        chat(call("read_file", ': "a"}')),
        chat({"delta": {}, "finish_reason": "tool_calls"}),
    ], True, {"choices.0.message.tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "read_file", "arguments": '{"path": "a"}'}}],
        "choices.0.message.content": None}),
    # return_token_ids (chat): prompt ids on the first chunk, each chunk's ids
    ("chat-return-token-ids", [
        chat({"delta": {"role": "assistant", "content": ""}, "logprobs": None},
             prompt_token_ids=[1, 2, 3], prompt_text=None),
        chat({"delta": {"content": "Hi"}, "token_ids": [7]}),
        chat({"delta": {"content": "!"}, "token_ids": [8], "finish_reason": "stop"}),
    ], True, {"prompt_token_ids": [1, 2, 3], "prompt_text": None,
              "choices.0.token_ids": [7, 8], "choices.0.message.content": "Hi!"}),
    # return_token_ids (completions): both on the choice
    ("completion-return-token-ids", [
        text({"text": "Hi", "prompt_token_ids": [1, 2], "token_ids": [7]}),
        text({"text": "!", "token_ids": [8], "finish_reason": "length"}),
    ], False, {"choices.0.prompt_token_ids": [1, 2], "choices.0.token_ids": [7, 8],
               "choices.0.text": "Hi!", "choices.0.finish_reason": "length"}),
    # null anywhere: fields present with null, a null logprobs list then a real one
    ("nulls-anywhere", [
        chat({"delta": {"role": "assistant", "content": None, "refusal": None,
                        "tool_calls": None, "reasoning": None},
              "logprobs": {"content": None, "refusal": None}, "finish_reason": None,
              "stop_reason": None}, usage=None, system_fingerprint=None),
        chat({"delta": {"content": "a", "tool_calls": [None, {"index": None,
                                                              "function": None}]},
              "logprobs": {"content": [{"token": "a", "logprob": -1.0, "bytes": None,
                                        "top_logprobs": []}], "refusal": None}}),
        chat({"index": None, "delta": None, "logprobs": None}),
        {**HEAD, "choices": None, "usage": None},
        chat({"delta": {"content": "b"}, "finish_reason": "stop", "stop_reason": None}),
    ], True, {"choices.0.message.content": "ab", "choices.0.message.refusal": None,
              "choices.0.logprobs": {"content": [{"token": "a", "logprob": -1.0,
                                                  "bytes": None, "top_logprobs": []}],
                                     "refusal": None},
              "choices.0.finish_reason": "stop"}),
    # a refusal streamed in pieces
    ("refusal", [
        chat({"delta": {"role": "assistant", "content": None, "refusal": "I can"}}),
        chat({"delta": {"refusal": "not."}, "finish_reason": "stop"}),
    ], True, {"choices.0.message.refusal": "I cannot.", "choices.0.message.content": ""}),
    # completions' four logprobs lists concatenated, one of them null on the first chunk
    ("completion-logprobs-nulls", [
        text({"text": "", "logprobs": {"text_offset": [], "token_logprobs": [],
                                       "tokens": [], "top_logprobs": None}}),
        text({"text": "a", "logprobs": {"text_offset": [0], "token_logprobs": [-0.5],
                                        "tokens": ["a"], "top_logprobs": [{"a": -0.5}]}}),
        text({"text": "b", "logprobs": {"text_offset": [1], "token_logprobs": [None],
                                        "tokens": ["b"], "top_logprobs": [None]},
              "finish_reason": "stop", "stop_reason": "\n"}),
    ], False, {"choices.0.logprobs": {"text_offset": [0, 1], "token_logprobs": [-0.5, None],
                                      "tokens": ["a", "b"],
                                      "top_logprobs": [{"a": -0.5}, None]},
               "choices.0.stop_reason": "\n"}),
    # fields passed through: top level (vLLM's and unknown ones), choice, delta
    ("passed-through", [
        chat({"delta": {"role": "assistant", "content": ""}}, kv_transfer_params=None),
        chat({"delta": {"content": "x", "annotations": [{"type": "url_citation"}],
                        "citations": ["a"]}, "routed_experts": "AAA="}),
        chat({"delta": {"annotations": [{"type": "file"}], "citations": ["b"]},
              "finish_reason": "stop", "stop_reason": 7}),
        chat(usage={"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
             system_fingerprint="fp", service_tier="default",
             kv_transfer_params={"remote": 1}, metrics={"time_to_first_token_ms": 5.0},
             vendor_extension={"k": "v"}),
    ], True, {"kv_transfer_params": {"remote": 1}, "metrics": {"time_to_first_token_ms": 5.0},
              "vendor_extension": {"k": "v"}, "system_fingerprint": "fp",
              "service_tier": "default", "usage.total_tokens": 4,
              "choices.0.routed_experts": "AAA=", "choices.0.stop_reason": 7,
              "choices.0.message.annotations": [{"type": "url_citation"}, {"type": "file"}],
              "choices.0.message.citations": ["a", "b"]}),
    # the legacy function_call, merged like a tool call
    ("legacy-function-call", [
        chat({"delta": {"role": "assistant", "function_call": {"name": "f", "arguments": "{"}}}),
        chat({"delta": {"function_call": {"name": "f", "arguments": "}"}},
              "finish_reason": "function_call"}),
    ], True, {"choices.0.message.function_call": {"name": "f", "arguments": "{}"}}),
]


def _at(doc: Any, path: str) -> Any:
    for part in path.split("."):
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


@pytest.mark.parametrize(("chunks", "is_chat", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_r3_assembly_is_total(chunks: list[dict[str, Any]], is_chat: bool,
                              expected: dict[str, Any]) -> None:
    doc = run(chunks, is_chat)
    for path, value in expected.items():
        assert _at(doc, path) == value, path
    assert doc["id"] == "c1" and doc["model"] == "m" and len(doc["choices"]) == 1
    orjson.dumps(doc)  # a JSON document, whatever came in


def test_r3_reasoning_content_key_kept_when_the_engine_used_it() -> None:
    doc = run([chat({"delta": {"role": "assistant", "reasoning_content": "th"}}),
               chat({"delta": {"reasoning_content": "ink", "content": "ok"},
                     "finish_reason": "stop"})])
    msg = doc["choices"][0]["message"]
    assert msg["reasoning"] == msg["reasoning_content"] == "think" and msg["content"] == "ok"
    plain = run([chat({"delta": {"reasoning": "a"}}), chat({"delta": {"content": "b"}})])
    assert "reasoning_content" not in plain["choices"][0]["message"]  # vLLM 0.32's shape


def test_null_token_ids_on_every_chunk_are_no_token_ids() -> None:
    """vLLM 0.32 writes ``"token_ids": null`` on every completions chunk of a request without
    ``return_token_ids``; its non-stream answer has ``token_ids: null`` (no list)."""
    doc = run([text({"text": "a", "token_ids": None, "prompt_token_ids": None}),
               text({"text": "b", "token_ids": None, "finish_reason": "stop"})], False)
    assert doc["choices"][0].get("token_ids") is None
    assert doc["choices"][0].get("prompt_token_ids") is None and doc["choices"][0]["text"] == "ab"
