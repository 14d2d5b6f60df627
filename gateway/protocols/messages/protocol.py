"""Anthropic Messages (``/v1/messages``) and token counting (``/v1/messages/count_tokens``).

Request: ``model``, ``messages`` (``role`` + string or content blocks: ``text``, ``image``,
``tool_use``, ``tool_result``, ``thinking``), ``max_tokens`` (required), ``system``, ``tools``,
``stream``. ``role: "system"`` entries may stand anywhere in ``messages`` (Claude Code sends its
agent lists and notices that way); they are forwarded in place, byte for byte: vLLM 0.32's
``AnthropicMessage.role`` is ``user | assistant | system`` and its conversion places each one
without rewriting earlier turns, so the engine's prefix cache still hits. **Fields the gateway
does not own are forwarded untouched** (``thinking`` of any type, ``context_management``,
``output_config``, ``metadata``, future ones): the gateway refuses only what it reads; the
engine ignores what its schema does not know (vLLM's request models ignore extra fields). The
``?beta=true`` query and the ``anthropic-beta`` header change nothing. Anthropic's
``service_tier`` (``auto`` | ``standard_only``) is the tier hint: ``standard_only`` →
standard, ``auto`` → the model's default (Anthropic API reference, "Messages": ``auto`` uses
priority capacity when available, which is the deployment's default choice here).
Owned field: ``model``. Clients authenticate with ``x-api-key`` (or Bearer).

Stream (Anthropic API reference, "Streaming messages"; vLLM 0.32
``entrypoints/anthropic/serving.py``): typed events ``message_start``, ``content_block_start``,
``content_block_delta`` (``text_delta``, ``thinking_delta``, ``input_json_delta``,
``signature_delta``), ``content_block_stop``, ``message_delta`` (stop reason, usage),
``message_stop``; ``ping`` at any time; ``error`` in-band. First content event: a
``content_block_delta`` or a ``tool_use`` block start (it names the tool). Usage: ``input_tokens``
excludes the cache: prompt = ``input_tokens`` + ``cache_read_input_tokens`` +
``cache_creation_input_tokens``, cached = ``cache_read_input_tokens``; the fields of
``message_start`` and ``message_delta`` are merged, the later winning (vLLM sends the prompt
count on ``message_start`` and the split with the cache on ``message_delta``). The answer's
``usage.service_tier`` reports the tier that served (``priority`` for fast, ``standard``).
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.common.sse import SSEEvent
from gateway.common.usage import Usage
from gateway.errors import (
    OVERLOADED_TYPE,
    GatewayError,
    InvalidRequest,
    UpstreamError,
    UpstreamOverloaded,
    stream_error,
)
from gateway.protocols.base import (
    CONTENT,
    DONE,
    ERROR,
    FRAME,
    HEAD_CONTENT,
    HEAD_ERROR,
    HEAD_FRAME,
    HEAD_MALFORMED,
    Protocol,
    Resumable,
    ResumePoint,
    Rewrite,
    StreamCodec,
    json_object,
    named_event,
)
from gateway.protocols.body import ParsedBody, splice_model
from gateway.protocols.error_shapes import ANTHROPIC_ERRORS, ErrorShape
from gateway.protocols.messages.request import ANTHROPIC_SERVICE_TIERS, parse_messages
from gateway.protocols.messages.resume import (
    CONTINUATION_PATH,
    MessagesSplice,
    continuation_body,
    resume_point,
)
from gateway.protocols.openai.chat import is_content as chat_is_content

_USAGE_FIELDS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)


def anthropic_usage(u: Any) -> Usage | None:
    """``Usage`` of an Anthropic usage object (module docstring), None when absent/malformed."""
    if not isinstance(u, dict):
        return None
    vals = [u.get(k) or 0 for k in _USAGE_FIELDS]
    if not all(type(v) is int and v >= 0 for v in vals):
        return None
    inp, out, read, created = vals
    return Usage(prompt=inp + read + created, completion=out, cached=read)


class MessagesStream(StreamCodec):
    """One Anthropic Messages stream (module docstring)."""

    __slots__ = ("_open", "_stopped", "_usage", "rewrite")

    def __init__(self, rewrite: Rewrite) -> None:
        super().__init__()
        self.rewrite = rewrite
        self._usage: dict[str, int] = {}
        self._open: object = None  # index of the text block open for the client, if any
        self._stopped = False  # message_delta relayed: the stop reason reached the client

    def _merge_usage(self, u: Any) -> None:
        if isinstance(u, dict):
            self._usage.update({k: v for k, v in u.items() if k in _USAGE_FIELDS and v is not None})
            self.usage = anthropic_usage(self._usage)

    def event(self, ev: SSEEvent) -> tuple[int, bytes]:
        data = ev.data
        assert data is not None
        doc = json_object(data)
        if doc is None:
            self.error = UpstreamError("engine sent a malformed event mid-stream")
            return ERROR, self.error_event(self.error)
        kind = doc.get("type")
        if kind == "content_block_delta":
            return CONTENT, named_event(kind, data)
        if kind == "message_start":
            message = doc.get("message")
            if isinstance(message, dict):
                _rewrite_message(message, self.rewrite)
                self._merge_usage(message.get("usage"))
                data = orjson.dumps(doc)
            return FRAME, named_event(kind, data)
        if kind == "message_delta":
            self._merge_usage(doc.get("usage"))
            self._open, self._stopped = None, True
            return FRAME, named_event(kind, data)
        if kind == "message_stop":
            return DONE, named_event(kind, data)
        if kind == "error" or (kind is None and "error" in doc):
            # an Anthropic ``error`` event, or an OpenAI-shaped ``{"error": ...}`` (an engine's
            # generic error path): one Anthropic error event with the engine's message
            self.error = _engine_error(doc)
            return ERROR, self.error_event(self.error)
        if kind == "content_block_start":
            block = doc.get("content_block")
            text = isinstance(block, dict) and block.get("type") == "text"
            self._open = doc.get("index") if text else None
            if isinstance(block, dict) and block.get("type") not in ("text", "thinking"):
                return CONTENT, named_event(kind, data)
        elif kind == "content_block_stop":
            self._open = None
        return FRAME, named_event(kind, data)

    def error_event(self, err: GatewayError) -> bytes:
        return ANTHROPIC_ERRORS.event(err, 0)

    def continuation(self, point: ResumePoint, carried: list[int]) -> StreamCodec:
        return MessagesSplice(point, carried)

    def resume_blocker(self, point: ResumePoint) -> str | None:
        """``finished`` once ``message_delta`` was relayed; ``block-closed`` unless the text
        block the point continues (``point.id``) is still open for the client (it saw its
        ``content_block_stop``, or another block's start): the framing events are not in
        ``relayed``, this codec saw them."""
        if self._stopped:
            return "finished"
        if self._open is None or str(self._open) != point.id:
            return "block-closed"
        return None


def _engine_error(doc: dict[str, Any]) -> GatewayError:
    """The client-facing error of an engine's ``error`` event, Anthropic- or OpenAI-shaped
    (``{"error": {"message": ...}}`` or ``{"error": "..."}``; its message kept):
    ``UpstreamOverloaded`` for an ``overloaded_error``, else ``UpstreamError``."""
    inner = doc.get("error")
    message = inner.get("message") if isinstance(inner, dict) else inner
    if isinstance(inner, dict) and inner.get("type") == OVERLOADED_TYPE:
        return UpstreamOverloaded(f"engine overloaded: {message or 'overloaded'}")
    return UpstreamError(f"engine error: {message if isinstance(message, str) else 'unknown'}")


def _rewrite_message(message: dict[str, Any], rewrite: Rewrite) -> None:
    if "model" in message:
        message["model"] = rewrite.client_model
    usage = message.get("usage")
    if isinstance(usage, dict):
        usage["service_tier"] = "priority" if rewrite.tier == "fast" else "standard"


def _delta_text(doc: dict[str, Any]) -> str:
    if doc.get("type") == "content_block_delta":
        d = doc.get("delta")
        if isinstance(d, dict):
            for k in ("text", "thinking", "partial_json"):
                if isinstance(d.get(k), str):
                    return d[k]
    elif doc.get("type") == "content_block_start":
        block = doc.get("content_block")
        if isinstance(block, dict) and isinstance(block.get("name"), str):
            return block["name"]
    return ""


class MessagesProtocol(Protocol, Resumable):
    """``POST /v1/messages`` (module docstring)."""

    name = "messages"
    path = "/v1/messages"
    operation = "chat"
    keepalive = b'event: ping\ndata: {"type": "ping"}\n\n'  # Anthropic's own keep-alive
    continuation_path = CONTINUATION_PATH  # vLLM continues a prefill on chat only
    errors: ErrorShape = ANTHROPIC_ERRORS

    def span_attributes(self) -> dict[str, str]:
        return {"speedgate.api": "anthropic.messages"}

    def parse(self, raw: bytes) -> ParsedBody:
        return parse_messages(raw, need_max_tokens=True)

    def service_tier(self, doc: dict[str, Any]) -> object:
        tier = doc.get("service_tier")
        return ANTHROPIC_SERVICE_TIERS.get(tier) if isinstance(tier, str) else None

    def upstream_body(
        self, body: ParsedBody, served_model: str, priority: int | None = None
    ) -> bytes:
        model = body.doc["model"]
        if model == served_model:
            return body.raw
        spliced = splice_model(body.raw, model, served_model)
        return spliced if spliced is not None else orjson.dumps({**body.doc, "model": served_model})

    def head_kind(self, ev: SSEEvent) -> tuple[int, GatewayError | None]:
        doc = json_object(ev.data or b"")
        if doc is None:
            return HEAD_MALFORMED, None
        kind = doc.get("type")
        if kind is None and ("choices" in doc or "error" in doc):  # a continuation's chunk
            if "error" in doc and not doc.get("choices"):
                return HEAD_ERROR, stream_error(doc)
            return (HEAD_CONTENT if chat_is_content(doc) else HEAD_FRAME), None
        if kind == "error":
            return HEAD_ERROR, _engine_error(doc)
        if kind in ("message_start", "ping"):
            return HEAD_FRAME, None
        if kind == "content_block_start":
            block = doc.get("content_block")
            if isinstance(block, dict) and block.get("type") in ("text", "thinking"):
                return HEAD_FRAME, None
        return HEAD_CONTENT, None

    def codec(self, body: ParsedBody, rewrite: Rewrite) -> StreamCodec:
        return MessagesStream(rewrite)

    def resume_point(self, body: ParsedBody, relayed: list[bytes]) -> ResumePoint:
        return resume_point(body, relayed)

    def continuation_body(
        self, body: ParsedBody, served_model: str, point: ResumePoint,
        priority: int | None = None,
    ) -> bytes:
        return continuation_body(body, served_model, point, priority)

    def is_ping(self, ev: SSEEvent) -> bool:
        if ev.event is not None:
            return ev.event == b"ping"
        data = ev.data or b""
        return data.find(b'"ping"') >= 0 and (json_object(data) or {}).get("type") == "ping"

    def json_usage(self, doc: dict[str, Any]) -> Usage | None:
        return anthropic_usage(doc.get("usage"))

    def rewrite_json(self, doc: dict[str, Any], body: ParsedBody, rewrite: Rewrite) -> bytes:
        _rewrite_message(doc, rewrite)
        return orjson.dumps(doc)

    def output_text(self, relayed: list[bytes]) -> str:
        parts = []
        for data in relayed:
            doc = json_object(data)
            if doc is not None:
                parts.append(_delta_text(doc))
        return "".join(parts)

    def json_output_text(self, doc: dict[str, Any]) -> str:
        parts: list[str] = []
        for b in doc.get("content") or ():
            if not isinstance(b, dict):
                continue
            for k in ("text", "thinking", "name"):
                if isinstance(b.get(k), str):
                    parts.append(b[k])
            if b.get("type") == "tool_use":
                parts.append(orjson.dumps(b.get("input") or {}).decode())
        return "".join(parts)


class CountTokensProtocol(MessagesProtocol):
    """``POST /v1/messages/count_tokens``: the same body without ``max_tokens``, answered by a
    replica of the model's default pool with ``{"input_tokens": N}``; no output, no usage."""

    name = "count_tokens"
    path = "/v1/messages/count_tokens"
    operation = "count_tokens"
    generates = False
    default_tier_only = True

    def parse(self, raw: bytes) -> ParsedBody:
        body = parse_messages(raw, need_max_tokens=False)
        if body.doc.get("stream"):
            raise InvalidRequest("stream: token counting does not stream", param="stream")
        return body

    def json_usage(self, doc: dict[str, Any]) -> Usage | None:
        return None

    def rewrite_json(self, doc: dict[str, Any], body: ParsedBody, rewrite: Rewrite) -> bytes:
        return orjson.dumps(doc)
