"""JSON answers of chat and completions requests assembled from an upstream stream.

The gateway asks the engine to stream every chat and completions request (docs/resilience.md),
so a non-streaming request gets the same staged timeouts (TTFT, stall),
retries and mid-stream resume as a stream. ``AssemblyCodec`` lets the events pass without
parsing them (a byte check finds a malformed or error event); at the end one parse of all the
payloads builds the response the engine would have sent for the non-stream request: vLLM's
``ChatCompletionResponse`` / ``CompletionResponse`` shape (``vllm/entrypoints/openai/
protocol.py``): choices in index order with the message (``content``, ``reasoning``,
``tool_calls`` merged by index), ``logprobs`` concatenated, ``finish_reason`` and
``stop_reason``; ``usage`` (with ``prompt_tokens_details``) and ``system_fingerprint`` from the
usage chunk; ``service_tier`` and ``model`` rewritten like any JSON answer.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.common.usage import Usage
from gateway.errors import GatewayError, UpstreamError, stream_error
from gateway.protocols.base import CONTENT, DONE, ERROR, ResumePoint, StreamCodec
from gateway.protocols.errors import OPENAI_ERRORS
from gateway.protocols.openai_splice import REASONING_KEYS, OpenAISplice, delta_reasoning
from gateway.relay.sse import SSEEvent

_ERROR_KEY = b'"error"'
_REASONING = frozenset(REASONING_KEYS)


class AssemblyCodec(StreamCodec):
    """Codec of an upstream stream that becomes one JSON answer: nothing is sent to the client
    until the end, so no event is rewritten; ``[DONE]`` ends it, an event that is not a JSON
    object (first and last byte) or that is an engine error is an error (parsed only then).
    ``rewriter`` and ``strip_usage`` serve a continuation's splice (``OpenAISplice``): usage is
    kept, so a continuation's usage chunk is relayed and its ``prompt_tokens_details`` and
    ``system_fingerprint`` reach the assembled answer (the usage summed over the attempts)."""

    __slots__ = ("rewriter", "strip_usage")

    def __init__(self, rewriter: Any) -> None:
        super().__init__()
        self.rewriter = rewriter
        self.strip_usage = False

    def event(self, ev: SSEEvent) -> tuple[int, bytes]:
        data = ev.data
        assert data is not None
        if ev.is_done:
            return DONE, b""
        if not data or data[0] != 0x7B or data[-1] != 0x7D:  # not "{...}"
            self.error = UpstreamError("engine sent a malformed event mid-stream")
            return ERROR, b""
        if data.find(_ERROR_KEY) >= 0:  # (``find``: faster here than ``in``)
            try:
                doc = orjson.loads(data)
            except orjson.JSONDecodeError:
                doc = None
            if not isinstance(doc, dict):
                self.error = UpstreamError("engine sent a malformed event mid-stream")
                return ERROR, b""
            if "error" in doc and not doc.get("choices"):
                self.error = stream_error(doc)
                return ERROR, b""
        return CONTENT, b""

    def error_event(self, err: GatewayError) -> bytes:
        return OPENAI_ERRORS.event(err, 0)

    def ending_after(
        self, engine: Usage | None, usage: Usage | None, relayed: list[bytes],
        ident: tuple[str | None, int | None],
    ) -> bytes | None:
        """None: a JSON answer whose every choice finished before a continuation broke is
        served by ``gateway.relay.assembled`` (as after the first attempt), not ended here."""
        return None

    def continuation(self, point: ResumePoint, carried: list[int]) -> StreamCodec:
        return OpenAISplice(self, point, carried)


def assemble(relayed: list[bytes], usage: Usage | None, *, chat: bool) -> dict[str, Any]:
    """The non-stream response document for the stream chunks ``relayed`` (raw payloads, every
    attempt's; a continuation's role chunk never among them). ``usage``: the summed usage of a
    resumed stream (None: the usage chunk among ``relayed`` is the engine's own). Raises
    ``UpstreamError`` when the payloads hold no chunk."""
    chunks = orjson.loads(b"[" + b",".join(relayed) + b"]") if relayed else []
    head: dict[str, Any] | None = None
    choices: dict[int, dict[str, Any]] = {}
    usage_doc: Any = None
    fingerprint = None
    for chunk in chunks:
        if not isinstance(chunk, dict):
            continue
        if head is None:
            head = chunk
        if chunk.get("usage") is not None:
            usage_doc = chunk["usage"]
        fingerprint = chunk.get("system_fingerprint") or fingerprint
        for c in chunk.get("choices") or ():
            index = c.get("index", 0)
            acc = choices.get(index)
            if acc is None:
                acc = choices[index] = _Choice(index, chat)
            acc.add(c)
    if head is None:
        raise UpstreamError("engine stream held no response chunk")
    if usage is not None:
        usage_doc = _usage_doc(usage_doc, usage)
    doc: dict[str, Any] = {
        "id": head.get("id"),
        "object": "chat.completion" if chat else "text_completion",
        "created": head.get("created"),
        "model": head.get("model"),
        "choices": [choices[i].done() for i in sorted(choices)],
        "service_tier": None,
        "system_fingerprint": fingerprint,
        "usage": usage_doc,
    }
    if chat:
        doc["prompt_logprobs"] = None
    return doc


def _usage_doc(engine: Any, usage: Usage) -> dict[str, Any]:
    details = engine.get("prompt_tokens_details") if isinstance(engine, dict) else None
    return {
        "prompt_tokens": usage.prompt,
        "total_tokens": usage.prompt + usage.completion,
        "completion_tokens": usage.completion,
        "prompt_tokens_details": {**details, "cached_tokens": usage.cached}
        if isinstance(details, dict) else details,
    }


class _Choice:
    """One choice being assembled: text, reasoning, tool calls by index, logprobs."""

    __slots__ = ("calls", "chat", "finish", "index", "logprobs", "reasoning", "stop", "text")

    def __init__(self, index: int, chat: bool) -> None:
        self.index, self.chat = index, chat
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.logprobs: dict[str, list[Any]] | None = None
        self.finish: Any = None
        self.stop: Any = None

    def add(self, c: dict[str, Any]) -> None:
        if c.get("finish_reason") is not None:
            self.finish, self.stop = c["finish_reason"], c.get("stop_reason")
        lp = c.get("logprobs")
        if isinstance(lp, dict):
            if self.logprobs is None:
                self.logprobs = {}
            for key, value in lp.items():
                if isinstance(value, list):
                    self.logprobs.setdefault(key, []).extend(value)
                else:
                    self.logprobs.setdefault(key, value)
        if not self.chat:
            if isinstance(c.get("text"), str):
                self.text.append(c["text"])
            return
        delta = c.get("delta") or {}
        if isinstance(delta.get("content"), str):
            self.text.append(delta["content"])
        if not _REASONING.isdisjoint(delta):  # most chunks carry none: no call
            thought = delta_reasoning(delta)
            if thought is not None:
                self.reasoning.append(thought)
        if "tool_calls" in delta:
            for call in delta["tool_calls"] or ():
                self._call(call)

    def _call(self, call: dict[str, Any]) -> None:
        i = call.get("index", 0)
        acc = self.calls.get(i)
        if acc is None:
            acc = self.calls[i] = {"id": None, "type": "function",
                                   "function": {"name": "", "arguments": ""}}
        if call.get("id"):
            acc["id"] = call["id"]
        if call.get("type"):
            acc["type"] = call["type"]
        fn = call.get("function") or {}
        if fn.get("name"):
            acc["function"]["name"] += fn["name"]
        if isinstance(fn.get("arguments"), str):
            acc["function"]["arguments"] += fn["arguments"]

    def done(self) -> dict[str, Any]:
        if not self.chat:
            return {"index": self.index, "text": "".join(self.text), "logprobs": self.logprobs,
                    "finish_reason": self.finish, "stop_reason": self.stop,
                    "prompt_logprobs": None}
        content: str | None = "".join(self.text)
        if self.calls and not content:
            content = None
        message: dict[str, Any] = {
            "role": "assistant", "content": content, "refusal": None, "annotations": None,
            "audio": None, "function_call": None,
        }
        if self.calls:
            message["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        message["reasoning"] = "".join(self.reasoning) if self.reasoning else None
        return {"index": self.index, "message": message, "logprobs": self.logprobs,
                "finish_reason": self.finish, "stop_reason": self.stop}
