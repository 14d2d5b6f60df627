"""Mid-stream resume for Anthropic Messages streams: what the client already got
(``resume_point``), the continuation request (``continuation_body``) and the codec that splices
its output into the client's stream (``MessagesSplice``).

vLLM's ``/v1/messages`` cannot continue a partial assistant turn: its Anthropic conversion
(``vllm/entrypoints/anthropic/serving.py``, ``to_chat_completion_request``) renders a trailing
assistant message with ``add_generation_prompt`` on and never sets ``continue_final_message``
(``build_chat_params`` lets the request's own fields override ``chat_template_kwargs``), so the
model would start a new turn after the prefill. The continuation therefore goes to the same
engine's ``/v1/chat/completions`` with the conversation converted the way vLLM converts it
(system first, text parts, ``thinking`` as the assistant's ``reasoning``, ``tool_use`` as
``tool_calls``, ``tool_result`` as ``tool`` messages, tools as functions) plus the partial
assistant text, ``continue_final_message: true`` and ``add_generation_prompt: false`` — the
same continuation the chat resume uses — and its chunks are turned back into the client's
Messages events: ``text_delta`` on the block the break cut, then one ``content_block_stop``,
``message_delta`` (stop reason, usage summed over the attempts) and ``message_stop``.

Resumable: the break came inside a text block (thinking blocks before it are carried as
reasoning). Blockers: ``tool-call`` (a ``tool_use`` block had started: its partial JSON input
cannot be continued exactly), ``thinking`` (the break cut a thinking block: its signature is the
engine's and a continuation cannot extend it), ``structured-output`` (``output_config.format``:
the engine's grammar would start again), ``finished`` (``message_delta`` was relayed),
``block-closed`` (the text block was closed for the client).
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.common.sse import SSEEvent
from gateway.errors import GatewayError
from gateway.protocols.base import ResumePoint, StreamCodec, named_event
from gateway.protocols.body import ParsedBody
from gateway.protocols.error_shapes import ANTHROPIC_ERRORS
from gateway.protocols.openai.resume import heal_tail
from gateway.protocols.splice.text_splice import TextSplice, chat_continuation
from gateway.telemetry.tokencount import count_text

#: the engine's chat path the continuation is sent to (module docstring)
CONTINUATION_PATH = "/v1/chat/completions"
# Anthropic fields the conversion consumes; every other field of the client's body (vLLM's
# extensions: ``chat_template_kwargs``, ``cache_salt``, ``vllm_xargs``, …) is carried as is
_CONVERTED = frozenset({
    "model", "messages", "system", "max_tokens", "stop_sequences", "stream", "tools",
    "tool_choice", "thinking", "metadata", "service_tier", "output_config", "container",
    "mcp_servers", "context_management",
})
# chat finish reasons in Anthropic's words (vLLM's ``_to_anthropic_stop_reason``)
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def resume_point(body: ParsedBody, relayed: list[bytes]) -> ResumePoint:
    """What the client got of a broken Messages stream (``relayed``: its content payloads:
    ``content_block_delta``, non-text ``content_block_start``; the framing events are the
    codec's to judge, ``MessagesStream.resume_blocker``): ``text``
    of the text block the break cut, ``reasoning`` the thinking before it, ``id`` the index
    of that block (as a string: the splice's block), and the blocker (module docstring)."""
    point = ResumePoint()
    kinds: dict[int, str] = {}
    text: dict[int, list[str]] = {}
    thinking: list[str] = []
    last = -1
    for data in relayed:
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(doc, dict):
            continue
        kind = doc.get("type")
        index = doc.get("index")
        if type(index) is not int:
            continue
        if kind == "content_block_start":
            point.blocker = point.blocker or "tool-call"
            kinds[index] = "tool"
            last = max(last, index)
            continue
        delta = doc.get("delta")
        if kind != "content_block_delta" or not isinstance(delta, dict):
            continue
        last = max(last, index)
        dtype = delta.get("type")
        if dtype == "text_delta" and isinstance(delta.get("text"), str):
            kinds.setdefault(index, "text")
            text.setdefault(index, []).append(delta["text"])
        elif dtype in ("thinking_delta", "signature_delta"):
            kinds.setdefault(index, "thinking")
            if isinstance(delta.get("thinking"), str):
                thinking.append(delta["thinking"])
        else:
            kinds[index] = "tool"
            point.blocker = point.blocker or "tool-call"
    config = body.doc.get("output_config")
    if isinstance(config, dict) and config.get("format") is not None:
        point.blocker = "structured-output"  # vLLM's grammar would restart (openai_resume)
    if point.blocker is None:
        if last < 0 or kinds.get(last) != "text":
            point.blocker = "thinking" if kinds.get(last) == "thinking" else "protocol"
        elif any(kinds.get(i) == "text" for i in range(last)):
            point.blocker = "protocol"  # text blocks apart: no single text to continue
    point.text = "".join(text.get(last, ()))
    point.reasoning = "".join(thinking)
    point.id = str(last)
    point.tokens = count_text(point.text) + count_text(point.reasoning)
    if point.text:
        point.heal = heal_tail(point.text)
    return point


def chat_messages(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The Anthropic conversation as vLLM's ``to_chat_completion_request`` converts it:
    ``system`` first, ``system`` entries in place, text and image blocks as content parts (a
    lone text part as a string), ``thinking`` as ``reasoning``, ``tool_use`` as
    ``tool_calls``, ``tool_result`` as ``tool`` messages (before the rest of the message)."""
    out: list[dict[str, Any]] = []
    system = _text(doc.get("system"))
    if system:
        out.append({"role": "system", "content": system})
    for m in doc.get("messages") or ():
        role, content = m.get("role"), m.get("content")
        if role == "system":
            if _text(content):
                out.append({"role": "system", "content": _text(content)})
            continue
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        msg: dict[str, Any] = {"role": role}
        parts: list[dict[str, Any]] = []
        calls: list[dict[str, Any]] = []
        reasoning: list[str] = []
        for b in content:
            kind = b.get("type")
            if kind == "text" and b.get("text"):
                parts.append({"type": "text", "text": b["text"]})
            elif kind == "image" and isinstance(b.get("source"), dict):
                parts.append({"type": "image_url", "image_url": {"url": _image_url(b["source"])}})
            elif kind == "thinking" and isinstance(b.get("thinking"), str):
                reasoning.append(b["thinking"])
            elif kind == "tool_use":
                args = orjson.dumps(b.get("input") or {}).decode()
                calls.append({"id": b.get("id"), "type": "function",
                              "function": {"name": b.get("name"), "arguments": args}})
            elif kind == "tool_result":
                out.append({"role": "tool", "tool_call_id": b.get("tool_use_id") or "",
                            "content": _text(b.get("content"))})
        if reasoning:
            msg["reasoning"] = "".join(reasoning)
        if calls:
            msg["tool_calls"] = calls
        if parts:
            msg["content"] = (parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text"
                              else parts)
        if parts or calls or reasoning:
            out.append(msg)
    return out


def continuation_body(
    body: ParsedBody, served_model: str, point: ResumePoint, priority: int | None = None,
) -> bytes:
    """The chat-completions request continuing ``point`` (module docstring): the converted
    conversation plus an assistant message with the carried text (and the thinking before it
    as ``reasoning``), ``max_tokens`` reduced by the carried tokens (the engine's count when
    known, else the estimate; at least 1), ``stop_sequences`` as ``stop``, tools as
    functions, ``tool_choice`` converted, the client's other fields carried, stream with usage.
    ``priority``: vLLM's field, as for the first attempt."""
    doc = body.doc
    out: dict[str, Any] = {k: v for k, v in doc.items() if k not in _CONVERTED}
    produced = chat_continuation(out, served_model, chat_messages(doc), point)
    out["max_tokens"] = max(1, int(doc.get("max_tokens") or 1) - produced)
    if doc.get("stop_sequences"):
        out["stop"] = doc["stop_sequences"]
    tools = [{"type": "function", "function": {
        "name": t.get("name"), "description": t.get("description"),
        "parameters": t.get("input_schema") or {}}}
        for t in doc.get("tools") or () if t.get("name")]
    if tools:
        out["tools"] = tools
        choice = doc.get("tool_choice")
        choice = choice if isinstance(choice, dict) else {}
        kind = choice.get("type")
        out["tool_choice"] = ({"type": "function", "function": {"name": choice.get("name")}}
                              if kind == "tool" else
                              {"any": "required", "none": "none"}.get(kind or "", "auto"))
    thinking = doc.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        out["thinking_token_budget"] = thinking.get("budget_tokens")
    elif isinstance(thinking, dict) and thinking.get("type") == "disabled":
        out["reasoning_effort"] = "none"  # vLLM's default ``disabled_thinking_effort``
    if priority is not None:
        out["priority"] = int(priority)
    return orjson.dumps(out)


class MessagesSplice(TextSplice):
    """Codec of a chat-completions continuation spliced into a Messages stream
    (``TextSplice``): each new piece of ``delta.content`` becomes a ``text_delta`` on the cut
    block (index ``int(point.id)``); the finish becomes one ``content_block_stop``,
    ``message_delta`` (``stop_reason`` as vLLM maps it, usage the sum of the attempts,
    ``summed_usage``) and ``message_stop``."""

    __slots__ = ("index",)
    cut = "text block"

    def __init__(self, point: ResumePoint, carried: list[int]) -> None:
        super().__init__(point, carried)
        self.index = int(point.id or 0)

    def continuation(self, point: ResumePoint, carried: list[int]) -> StreamCodec:
        return MessagesSplice(point, carried)

    def error_event(self, err: GatewayError) -> bytes:
        return ANTHROPIC_ERRORS.event(err, 0)

    def text_event(self, text: str, ev: SSEEvent) -> bytes:
        data = orjson.dumps({"type": "content_block_delta", "index": self.index,
                             "delta": {"type": "text_delta", "text": text}})
        ev.data = data  # what the client gets: ``relayed`` keeps it (a later resume reads it)
        return named_event("content_block_delta", data)

    def ending_events(self) -> bytes:
        """``content_block_stop``, ``message_delta`` and ``message_stop`` for the client."""
        reason, matched = self.finish or ("stop", None)
        stop, sequence = (("stop_sequence", matched) if matched is not None
                          else (_STOP_REASONS.get(reason, "end_turn"), None))
        delta: dict[str, Any] = {"type": "message_delta",
                                 "delta": {"stop_reason": stop, "stop_sequence": sequence}}
        if self.usage is not None:
            u = self.usage
            delta["usage"] = {"input_tokens": u.prompt - u.cached, "output_tokens": u.completion}
            if u.cached:
                delta["usage"]["cache_read_input_tokens"] = u.cached
        return (named_event("content_block_stop", orjson.dumps(
                    {"type": "content_block_stop", "index": self.index}))
                + named_event("message_delta", orjson.dumps(delta))
                + named_event("message_stop", b'{"type":"message_stop"}'))


def _text(content: Any) -> str:
    """The text of a string or of the text blocks of a block list."""
    if isinstance(content, str):
        return content
    return "".join(b.get("text") or "" for b in content or () if isinstance(b, dict)
                   and b.get("type") == "text")


def _image_url(source: dict[str, Any]) -> str:
    """An Anthropic image source as a URL (vLLM's ``_convert_image_source_to_url``)."""
    if source.get("type") == "base64":
        return f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"
    return str(source.get("url", ""))
