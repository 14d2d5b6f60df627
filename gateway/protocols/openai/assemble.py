"""JSON answers of chat and completions requests assembled from an upstream stream.

The gateway asks the engine to stream every chat and completions request (docs/resilience.md),
so a non-streaming request gets the same staged timeouts (TTFT, stall),
retries and mid-stream resume as a stream. ``AssemblyCodec`` lets the events pass without
parsing them (a byte check finds a malformed or error event); at the end one parse of all the
payloads builds the response the engine would have sent for the non-stream request: vLLM's
``ChatCompletionResponse`` / ``CompletionResponse`` shape (``vllm/entrypoints/openai/
protocol.py``): choices in index order with the message (``content``, ``reasoning``,
``tool_calls`` merged by index, by ``id`` without one), ``logprobs`` concatenated,
``finish_reason`` and ``stop_reason``; ``usage`` (with ``prompt_tokens_details``) and
``system_fingerprint`` from the usage chunk; ``service_tier`` and ``model`` rewritten like any
JSON answer.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.common.sse import SSEEvent
from gateway.common.usage import Usage
from gateway.errors import GatewayError, UpstreamError, stream_error
from gateway.protocols.base import CONTENT, DONE, ERROR, ResumePoint, StreamCodec
from gateway.protocols.error_shapes import OPENAI_ERRORS
from gateway.protocols.openai.splice import REASONING_KEYS, OpenAISplice, delta_reasoning

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
    ``UpstreamError`` when the payloads hold no chunk.

    Total over what a chunk may carry (``null`` anywhere, any field): ``id``, ``created`` and
    ``model`` from the first chunk; ``usage`` the last one sent; every other top-level field
    (``system_fingerprint``, ``service_tier``, vLLM's ``prompt_token_ids``, ``prompt_text``,
    ``kv_transfer_params``, ``metrics``, or one this code does not know) passed through, its
    last non-null value. Choices: see ``_Choice``."""
    chunks = orjson.loads(b"[" + b",".join(relayed) + b"]") if relayed else []
    head: dict[str, Any] | None = None
    choices: dict[int, _Choice] = {}
    usage_doc: Any = None
    extra: dict[str, Any] = {}
    for chunk in chunks:
        if not isinstance(chunk, dict):
            continue
        if head is None:
            head = chunk
        if not chunk.keys() <= _ASSEMBLED_TOP:  # (a subset test in C: mostly true)
            for key, value in chunk.items():
                if key not in _ASSEMBLED_TOP and (value is not None or key not in extra):
                    extra[key] = value
        if chunk.get("usage") is not None:
            usage_doc = chunk["usage"]
        listed = chunk.get("choices")
        for c in listed if isinstance(listed, list) else ():
            if not isinstance(c, dict):
                continue
            index = c.get("index")
            index = index if type(index) is int else 0
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
        "service_tier": extra.pop("service_tier", None),
        "system_fingerprint": extra.pop("system_fingerprint", None),
        "usage": usage_doc,
    }
    if chat:
        doc["prompt_logprobs"] = extra.pop("prompt_logprobs", None)
    doc.update(extra)
    return doc


#: top-level chunk fields the assembly builds itself (the rest pass through)
_ASSEMBLED_TOP = frozenset({"id", "object", "created", "model", "choices", "usage"})
#: choice fields ``_Choice`` builds itself (the rest pass through)
_ASSEMBLED_CHOICE = frozenset({"index", "delta", "text", "logprobs", "finish_reason",
                               "stop_reason", "token_ids", "prompt_token_ids"})
#: the fields of most streamed choices (the rest: ``_Choice._uncommon``)
_COMMON_CHOICE = frozenset({"index", "delta", "text", "logprobs", "finish_reason",
                            "stop_reason"})
#: chat delta fields ``_Choice`` merges itself (the rest: strings and lists concatenated,
#: anything else its last non-null value)
_ASSEMBLED_DELTA = frozenset({"role", "content", "refusal", "tool_calls", "function_call",
                              *_REASONING})


def _usage_doc(engine: Any, usage: Usage) -> dict[str, Any]:
    details = engine.get("prompt_tokens_details") if isinstance(engine, dict) else None
    return {
        "prompt_tokens": usage.prompt,
        "total_tokens": usage.prompt + usage.completion,
        "completion_tokens": usage.completion,
        "prompt_tokens_details": {**details, "cached_tokens": usage.cached}
        if isinstance(details, dict) else details,
    }


def _concat(acc: dict[str, Any], key: str, value: Any) -> None:
    """Merge one streamed ``value`` of ``key`` into ``acc``: strings and lists concatenated,
    anything else replaces what was there; ``None`` only notes the key (vLLM's chunks set
    fields to null until they carry something)."""
    have = acc.get(key)
    if value is None:
        acc.setdefault(key, None)
    elif isinstance(value, str) and isinstance(have, str):
        acc[key] = have + value
    elif isinstance(value, list) and isinstance(have, list):
        have.extend(value)
    else:
        acc[key] = list(value) if isinstance(value, list) else value


class _Choice:
    """One choice being assembled, as vLLM's non-stream serving builds it
    (``vllm/entrypoints/openai/chat_completion/serving.py``, ``completion/serving.py``):
    text (``delta.content`` / ``text``), ``refusal``, ``reasoning`` (either key), tool calls
    merged by index (``id`` and ``function.name`` taken once: some servers resend the name on
    every delta; ``arguments`` concatenated), the legacy ``function_call`` alike, logprobs
    concatenated list by list (chat ``content``/``refusal``; completions ``tokens``,
    ``token_logprobs``, ``top_logprobs``, ``text_offset``), ``token_ids`` concatenated,
    ``prompt_token_ids`` (completions) the first sent, ``finish_reason`` and ``stop_reason``;
    other delta and choice fields passed through (``_concat``)."""

    __slots__ = ("call_ids", "calls", "chat", "extra", "finish", "function_call", "index",
                 "logprobs", "message", "prompt_ids", "reasoning", "reasoning_key", "stop",
                 "text", "token_ids")

    def __init__(self, index: int, chat: bool) -> None:
        self.index, self.chat = index, chat
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.reasoning_key = False  # the engine wrote ``reasoning_content`` (vLLM < 0.32)
        self.calls: dict[int, dict[str, Any]] = {}
        self.call_ids: dict[str, int] = {}  # a call's ``id`` → its key in ``calls``
        self.function_call: dict[str, Any] | None = None
        self.logprobs: dict[str, Any] | None = None
        self.message: dict[str, Any] = {}  # refusal and the delta fields passed through
        self.extra: dict[str, Any] = {}  # the choice fields passed through
        self.token_ids: list[int] | None = None
        self.prompt_ids: Any = None
        self.finish: Any = None
        self.stop: Any = None

    def add(self, c: dict[str, Any]) -> None:
        """Merge one streamed choice ``c`` (any field may be absent or ``null``)."""
        if c.get("finish_reason") is not None:
            self.finish, self.stop = c["finish_reason"], c.get("stop_reason")
        elif c.get("stop_reason") is not None:
            self.stop = c["stop_reason"]
        lp = c.get("logprobs")
        if isinstance(lp, dict):
            if self.logprobs is None:
                self.logprobs = {}
            for key, value in lp.items():
                _concat(self.logprobs, key, value)
        if not c.keys() <= _COMMON_CHOICE:  # (a subset test in C: mostly true)
            self._uncommon(c)
        if not self.chat:
            if isinstance(c.get("text"), str):
                self.text.append(c["text"])
            return
        delta = c.get("delta")
        if not isinstance(delta, dict):
            return
        if isinstance(delta.get("content"), str):
            self.text.append(delta["content"])
        if not _REASONING.isdisjoint(delta):  # most chunks carry none: no call
            thought = delta_reasoning(delta)
            if thought is not None:
                self.reasoning.append(thought)
                self.reasoning_key = self.reasoning_key or "reasoning_content" in delta
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            for position, call in enumerate(calls):
                if isinstance(call, dict):
                    self._call(self._call_key(call, position), call)
        if len(delta) > 1 or "content" not in delta:  # not a plain content delta
            self._rest(delta)

    def _uncommon(self, c: dict[str, Any]) -> None:
        """The choice's fields other than ``_COMMON_CHOICE``: token ids, passed-through ones."""
        ids = c.get("token_ids")  # vLLM writes ``null`` on every chunk without return_token_ids
        if isinstance(ids, list):
            if self.token_ids is None:
                self.token_ids = []
            self.token_ids.extend(ids)
        if self.prompt_ids is None and c.get("prompt_token_ids") is not None:
            self.prompt_ids = c["prompt_token_ids"]
        for key, value in c.items():
            if key not in _ASSEMBLED_CHOICE:
                _concat(self.extra, key, value)

    def _rest(self, delta: dict[str, Any]) -> None:
        """The delta's fields other than content, reasoning and tool calls."""
        refusal = delta.get("refusal")
        if isinstance(refusal, str):
            self.message["refusal"] = (self.message.get("refusal") or "") + refusal
        fc = delta.get("function_call")
        if isinstance(fc, dict):
            if self.function_call is None:
                self.function_call = {"name": "", "arguments": ""}
            _merge_function(self.function_call, fc)
        if not delta.keys() <= _ASSEMBLED_DELTA:
            for key, value in delta.items():
                if key not in _ASSEMBLED_DELTA:
                    _concat(self.message, key, value)

    def _call_key(self, call: dict[str, Any], position: int) -> int:
        """Which call a streamed tool-call delta continues: its ``index`` (OpenAI, vLLM); without
        one (Gemini's and Ollama's OpenAI-compatible streams send each call whole, at position
        0 of its chunk) the call of the same ``id``, a new call for a new ``id``, and for a
        delta with neither the last call (or its position when there is none)."""
        i = call.get("index")
        if type(i) is int:
            key = i
        else:
            ident = call.get("id")
            if isinstance(ident, str) and ident:
                key = self.call_ids.get(ident, -1)
                if key < 0:
                    key = max(self.calls, default=-1) + 1
            else:
                return max(self.calls) if self.calls else position
        ident = call.get("id")
        if isinstance(ident, str) and ident:
            self.call_ids.setdefault(ident, key)
        return key

    def _call(self, i: int, call: dict[str, Any]) -> None:
        acc = self.calls.get(i)
        if acc is None:
            acc = self.calls[i] = {"id": None, "type": "function",
                                   "function": {"name": "", "arguments": ""}}
        if isinstance(call.get("id"), str) and call["id"] and not acc["id"]:
            acc["id"] = call["id"]
        if isinstance(call.get("type"), str) and call["type"]:
            acc["type"] = call["type"]
        fn = call.get("function")
        if isinstance(fn, dict):
            _merge_function(acc["function"], fn)

    def done(self) -> dict[str, Any]:
        """The choice of the non-stream document (vLLM's field order)."""
        if not self.chat:
            out: dict[str, Any] = {
                "index": self.index, "text": "".join(self.text), "logprobs": self.logprobs,
                "finish_reason": self.finish, "stop_reason": self.stop, "prompt_logprobs": None}
            if self.token_ids is not None:
                out["token_ids"] = self.token_ids
            if self.prompt_ids is not None:
                out["prompt_token_ids"] = self.prompt_ids
            out.update(self.extra)
            return out
        content: str | None = "".join(self.text)
        if self.calls and not content:
            content = None
        extra = dict(self.message)
        message: dict[str, Any] = {
            "role": "assistant", "content": content, "refusal": extra.pop("refusal", None),
            "annotations": extra.pop("annotations", None), "audio": extra.pop("audio", None),
            "function_call": self.function_call,
        }
        if self.calls:
            message["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        reasoning = "".join(self.reasoning) if self.reasoning else None
        message["reasoning"] = reasoning
        if self.reasoning_key:
            message["reasoning_content"] = reasoning
        message.update(extra)
        out = {"index": self.index, "message": message, "logprobs": self.logprobs,
               "finish_reason": self.finish, "stop_reason": self.stop}
        if self.token_ids is not None:
            out["token_ids"] = self.token_ids
        out.update(self.extra)
        return out


def _merge_function(acc: dict[str, Any], fn: dict[str, Any]) -> None:
    """Merge one streamed ``function`` (of a tool call, or the legacy ``function_call``) into
    ``acc``: ``name`` taken once (vLLM sends it on the call's first delta only; servers that
    resend it on every delta would otherwise give ``read_fileread_file``), ``arguments``
    concatenated."""
    name = fn.get("name")
    if isinstance(name, str) and name and not acc["name"]:
        acc["name"] = name
    args = fn.get("arguments")
    if isinstance(args, str):
        acc["arguments"] += args
