"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens`` (Anthropic) as vLLM 0.32 serves
them (``entrypoints/anthropic/serving.py``, ``api_router.py``, ``protocol.py``).

- ``thinking`` (``enabled``/``adaptive``) asks for reasoning: a ``thinking`` block first;
- the request becomes a chat completion: ``system`` (a string or text blocks) as the system
  message, text blocks as text, ``tool_use`` blocks as tool calls, ``tool_result`` blocks as
  tool messages, tools as function tools (``input_schema`` → ``parameters``), ``tool_choice``
  ``auto``/``any``/``none``/``tool`` → ``auto``/``required``/``none``/named, ``stop_sequences``
  → ``stop``; ``max_tokens`` is required (a schema error is vLLM's OpenAI-shaped 400);
- errors after validation are Anthropic-shaped: ``{"type": "error", "error": {"type",
  "message"}}`` with vLLM's error type names (``BadRequestError``...);
- the message id is the chat completion's (``chatcmpl-`` + 16 hex), tool-use ids
  ``chatcmpl-tool-`` + 16 hex;
- stream: ``event: <type>`` + ``data:``; ``message_start`` (usage ``input_tokens`` = the whole
  prompt, ``output_tokens`` 0: the first chunk carries no cache details), then per block
  ``content_block_start`` / ``content_block_delta`` (``thinking_delta`` then one
  ``signature_delta``, ``text_delta``, ``input_json_delta``) / ``content_block_stop``,
  ``message_delta`` (``stop_reason``, ``stop_sequence``, usage with
  ``input_tokens`` = prompt − cached and ``cache_read_input_tokens`` = cached when prompt token
  details are on), ``message_stop``; no ``ping``;
- JSON (``exclude_none``): ``id``, ``type``, ``role``, ``content`` (text, then tool uses; one
  empty text block when nothing else), ``model``, ``stop_reason``, ``usage``;
- stop reasons: ``stop`` → ``end_turn``, ``length`` → ``max_tokens``, tool calls → ``tool_use``;
- count_tokens: ``{"input_tokens": N, "context_management": {"original_input_tokens": N}}``.

Content events counted by the faults: text and argument deltas, and a tool-use block start.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
from aiohttp import web

from engines.sim import protocol as P
from engines.sim.request import RequestContext, RequestError
from engines.sim.responder import (
    Event,
    collect,
    reasoning_signature,
    respond_typed_stream,
)

Deliveries = AsyncIterator[list[tuple[int, int, bool]]]
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


class SchemaError(RequestError):
    """A request the Anthropic schema rejects: vLLM answers it OpenAI-shaped (its global
    validation handler), not Anthropic-shaped."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(400, message, param)


def error_body(message: str, status: int, *, flat: bool = False, type_: str | None = None,
               param: str | None = None) -> bytes:
    """vLLM's Anthropic error: ``{"type": "error", "error": {"type", "message"}}``."""
    return orjson.dumps({"type": "error",
                         "error": {"type": type_ or P.error_type(status), "message": message}})


def _blocks_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(
        b["text"] for b in content or ()
        if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
    )


def to_chat(body: dict[str, Any], *, need_max_tokens: bool = True) -> dict[str, Any]:
    """The request in chat-completions form; ``SchemaError`` for a body vLLM's schema
    refuses."""
    cap = body.get("max_tokens")
    if need_max_tokens and (type(cap) is not int or cap < 1):
        raise SchemaError("1 validation error: max_tokens Field required", "body.max_tokens")
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise SchemaError("1 validation error: messages Field required", "body.messages")
    raw_system, tools = body.get("system"), body.get("tools")
    if raw_system is not None and not isinstance(raw_system, str | list):
        raise SchemaError("1 validation error: system Input should be a valid string or list",
                          "body.system")
    if tools is not None and not isinstance(tools, list):
        raise SchemaError("1 validation error: tools Input should be a valid list", "body.tools")
    system = _blocks_text(raw_system)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for m in msgs:
        if not isinstance(m, dict):
            raise SchemaError("messages: each message must be an object", "body.messages")
        role, content = m.get("role"), m.get("content")
        if isinstance(content, str):
            messages.append({"role": role, "content": content})
            continue
        text, calls = [], []
        for b in content if isinstance(content, list) else ():
            kind = b.get("type") if isinstance(b, dict) else None
            if kind == "text":
                text.append(b.get("text") or "")
            elif kind == "tool_use":
                args = orjson.dumps(b.get("input") or {}).decode()
                calls.append({"id": b.get("id"), "type": "function",
                              "function": {"name": b.get("name"), "arguments": args}})
            elif kind == "tool_result":
                messages.append({"role": "tool", "tool_call_id": b.get("tool_use_id") or "",
                                 "content": _blocks_text(b.get("content"))})
        if text or calls:
            msg: dict[str, Any] = {"role": role, "content": "".join(text) or None}
            if calls:
                msg["tool_calls"] = calls
            messages.append(msg)
    tools = [{"type": "function", "function": {"name": t.get("name"),
                                               "parameters": t.get("input_schema") or {}}}
             for t in body.get("tools") or () if isinstance(t, dict)]
    choice: Any = None
    tc = body.get("tool_choice")
    if isinstance(tc, dict):
        choice = {"auto": "auto", "any": "required", "none": "none"}.get(tc.get("type"))
        if tc.get("type") == "tool":
            choice = {"type": "function", "function": {"name": tc.get("name")}}
    thinking = body.get("thinking")
    effort = "medium" if isinstance(thinking, dict) and thinking.get("type") in (
        "enabled", "adaptive") else None
    return {"model": body.get("model"), "messages": messages, "tools": tools or None,
            "tool_choice": choice or ("auto" if tools else None), "max_tokens": cap,
            "stop": body.get("stop_sequences"), "reasoning_effort": effort}


def usage(ctx: RequestContext, final: bool) -> dict[str, Any]:
    """Anthropic usage: ``message_start`` (``final`` False) has the whole prompt as
    ``input_tokens``; the end splits off ``cache_read_input_tokens`` when details are on."""
    prompt = ctx.prompt_tokens
    if not final:
        return {"input_tokens": prompt, "output_tokens": 0}
    out: dict[str, Any] = {"input_tokens": prompt, "output_tokens": ctx.completion_tokens}
    if ctx.state.config.enable_prompt_tokens_details:
        cached = ctx.cached_tokens()
        out["input_tokens"] = prompt - cached
        out["cache_read_input_tokens"] = cached
    return out


class _Builder:
    """Events of one streamed message and its block state."""

    def __init__(self, ctx: RequestContext) -> None:
        self.ctx = ctx
        self.index = 0  # index of the next block
        self.open: str | None = None  # "thinking" | "text" | "tool_use"
        self.thinking = ""
        self.tool_used = False

    @staticmethod
    def _ev(kind: str, doc: dict[str, Any], content: bool = False) -> Event:
        return kind.encode(), orjson.dumps({"type": kind, **doc}), content

    def start(self) -> list[Event]:
        ctx = self.ctx
        message = {"id": ctx.rid, "type": "message", "role": "assistant", "content": [],
                   "model": ctx.model, "stop_reason": None, "stop_sequence": None,
                   "usage": usage(ctx, final=False)}
        return [self._ev("message_start", {"message": message})]

    def close(self) -> list[Event]:
        if self.open is None:
            return []
        events = []
        if self.open == "thinking":  # the signature closes a thinking block
            events.append(self._ev("content_block_delta", {"index": self.index, "delta": {
                "type": "signature_delta", "signature": reasoning_signature(self.thinking)}}))
        self.open = None
        self.index += 1
        return [*events, self._ev("content_block_stop", {"index": self.index - 1})]

    def delta(self, kind: str, text: str) -> list[Event]:
        events: list[Event] = []
        if kind == "r":
            if not text:
                return events
            if self.open != "thinking":
                events += self.close()
                self.open, self.thinking = "thinking", ""
                events.append(self._ev("content_block_start", {"index": self.index,
                              "content_block": {"type": "thinking", "thinking": "",
                                                "signature": ""}}))
            self.thinking += text
            events.append(self._ev("content_block_delta", {
                "index": self.index, "delta": {"type": "thinking_delta", "thinking": text}},
                True))
        elif kind == "c":
            if not text:
                return events
            if self.open != "text":
                events += self.close()
                self.open = "text"
                events.append(self._ev("content_block_start", {
                    "index": self.index, "content_block": {"type": "text", "text": ""}}))
            events.append(self._ev("content_block_delta", {
                "index": self.index, "delta": {"type": "text_delta", "text": text}}, True))
        elif kind == "h":
            events += self.close()
            self.open, self.tool_used = "tool_use", True
            block = {"type": "tool_use", "id": P.random_id("chatcmpl-tool-"), "name": text,
                     "input": {}}
            events.append(self._ev("content_block_start",
                                   {"index": self.index, "content_block": block}, True))
        elif text:
            events.append(self._ev("content_block_delta", {
                "index": self.index, "delta": {"type": "input_json_delta", "partial_json": text}},
                True))
        return events

    def end(self) -> list[Event]:
        stop = STOP_REASONS.get(self.ctx.plans[0].finish, "end_turn")
        if self.tool_used and stop == "end_turn":
            stop = "tool_use"
        return [*self.close(),
                self._ev("message_delta", {"delta": {"stop_reason": stop, "stop_sequence": None},
                                           "usage": usage(self.ctx, final=True)}),
                self._ev("message_stop", {})]


async def respond_stream(request: web.Request, ctx: RequestContext, deliveries: Deliveries
                         ) -> web.StreamResponse:
    """Stream the message's typed events (module docstring)."""
    b = _Builder(ctx)
    return await respond_typed_stream(request, ctx, deliveries, b.start, b.delta, b.end,
                                      error_event=stream_error_event,
                                      ping=b'event: ping\ndata: {"type": "ping"}\n\n')


def stream_error_event(message: str, status: int, type_: str | None) -> bytes:
    """The Anthropic in-stream error event (``event: error``, the ``error_body`` object), as
    Anthropic's API streams it (e.g. ``overloaded_error`` after the 200)."""
    return b"event: error\ndata: " + error_body(message, status, type_=type_) + b"\n\n"


async def respond_full(request: web.Request, ctx: RequestContext, deliveries: Deliveries
                       ) -> web.Response:
    """Wait for the output and answer the message (module docstring)."""
    faulty = await collect(request, ctx, deliveries)
    if faulty is not None:
        return faulty
    plan = ctx.plans[0]
    text = "".join(t for k, t in plan.items if k == "c")
    thinking = "".join(t for k, t in plan.items if k == "r")
    name = next((t for k, t in plan.items if k == "h"), None)
    content: list[dict[str, Any]] = [{"type": "thinking", "thinking": thinking,
                                      "signature": reasoning_signature(thinking)}
                                     ] if thinking else []
    if text:
        content.append({"type": "text", "text": text})
    stop = STOP_REASONS.get(plan.finish, "end_turn")
    if name is not None:
        args = "".join(t for k, t in plan.items if k == "a")
        content.append({"type": "tool_use", "id": P.random_id("chatcmpl-tool-"), "name": name,
                        "input": orjson.loads(args or "{}")})
        stop = "tool_use" if stop == "end_turn" else stop
    body = {"id": ctx.rid, "type": "message", "role": "assistant",
            "content": content or [{"type": "text", "text": ""}], "model": ctx.model,
            "stop_reason": stop, "usage": usage(ctx, final=True)}
    return web.Response(body=orjson.dumps(body), content_type="application/json")


def count_tokens_body(prompt_tokens: int) -> bytes:
    """The ``count_tokens`` answer."""
    return orjson.dumps({"input_tokens": prompt_tokens,
                         "context_management": {"original_input_tokens": prompt_tokens}})
