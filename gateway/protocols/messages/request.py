"""The Messages API's request side: the body's checks (``parse_messages``: the fields the
gateway reads, each refused with a 400 naming it) and its chat-shaped view (``chat_view``) for
routing keys and token estimates. ``role: "system"`` entries may stand anywhere in ``messages``
(as Claude Code sends them; vLLM's Anthropic models accept them in place)."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.errors import InvalidRequest
from gateway.protocols.body import ParsedBody, load_json_object

_ROLES = ("user", "assistant", "system")
#: Anthropic's ``service_tier`` values and the OpenAI tier each asks for (None: the gateway's
#: own choice, ``auto``)
ANTHROPIC_SERVICE_TIERS: dict[str, str | None] = {"standard_only": "default", "auto": None}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str)
        )
    return ""


def chat_view(doc: dict[str, Any]) -> dict[str, Any]:
    """The request as a chat-completions conversation (routing keys, token estimates): the
    ``system`` prompt first, ``system`` entries of ``messages`` as system messages in place,
    ``tool_use`` blocks as ``tool_calls``, ``tool_result`` blocks as ``tool`` messages, text and
    thinking as text parts (images are not counted); ``tools`` as they are."""
    messages: list[dict[str, Any]] = []
    system = _text(doc.get("system"))
    if system:
        messages.append({"role": "system", "content": system})
    for m in doc.get("messages") or ():
        if not isinstance(m, dict):
            continue
        role, content = m.get("role"), m.get("content")
        if isinstance(content, str):
            messages.append({"role": role, "content": content})
            continue
        parts: list[dict[str, Any]] = []
        calls: list[dict[str, Any]] = []
        for b in content if isinstance(content, list) else ():
            if not isinstance(b, dict):
                continue
            kind = b.get("type")
            if kind == "tool_use":
                args = orjson.dumps(b.get("input") or {}).decode()
                calls.append({"id": b.get("id"), "type": "function",
                              "function": {"name": b.get("name"), "arguments": args}})
            elif kind == "tool_result":
                messages.append({"role": "tool", "tool_call_id": b.get("tool_use_id"),
                                 "content": _text(b.get("content"))})
            elif isinstance(b.get("text"), str):
                parts.append({"type": "text", "text": b["text"]})
            elif isinstance(b.get("thinking"), str):
                parts.append({"type": "text", "text": b["thinking"]})
        if parts or calls:
            msg: dict[str, Any] = {"role": role, "content": parts}
            if calls:
                msg["tool_calls"] = calls
            messages.append(msg)
    return {"messages": messages, "tools": doc.get("tools"), "max_tokens": doc.get("max_tokens")}


def _is_content(value: object) -> bool:
    """True for Anthropic content: a string, or an array of objects that each name a ``type``
    (text blocks need a string ``text``)."""
    if isinstance(value, str):
        return True
    if not isinstance(value, list):
        return False
    for b in value:
        if not isinstance(b, dict) or not isinstance(b.get("type"), str):
            return False
        if b["type"] == "text" and not isinstance(b.get("text"), str):
            return False
    return True


def parse_messages(raw: bytes, *, need_max_tokens: bool) -> ParsedBody:
    """Parse and validate an Anthropic Messages body the way Anthropic's API refuses it
    (``model``; non-empty ``messages`` of objects with role ``user``/``assistant``/``system`` and
    string or block content; ``system`` a string or text blocks; ``tools`` an array of objects;
    ``max_tokens`` an integer ≥ 1, required when ``need_max_tokens``; ``stream`` boolean;
    ``service_tier``), so a client's mistake never reaches, crashes or counts against a replica.
    Raises ``InvalidRequest`` (400) naming the field."""
    doc = load_json_object(raw)
    model = doc.get("model")
    if model is None:
        raise InvalidRequest("model: Field required", param="model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model: must be a non-empty string", param="model")
    msgs = doc.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise InvalidRequest("messages: must be a non-empty array", param="messages")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise InvalidRequest(
                f"messages.{i}: must be an object with role 'user', 'assistant' or 'system'",
                param=f"messages.{i}",
            )
        if not _is_content(m.get("content")):
            raise InvalidRequest(
                f"messages.{i}.content: must be a string or an array of content blocks",
                param=f"messages.{i}.content",
            )
    system = doc.get("system")
    if system is not None and not _is_content(system):
        raise InvalidRequest("system: must be a string or an array of text blocks",
                             param="system")
    tools = doc.get("tools")
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(t, dict) for t in tools)
    ):
        raise InvalidRequest("tools: must be an array of tool objects", param="tools")
    cap = doc.get("max_tokens")
    if cap is None and need_max_tokens:
        raise InvalidRequest("max_tokens: Field required", param="max_tokens")
    if cap is not None and (type(cap) is not int or cap < 1):
        raise InvalidRequest("max_tokens: must be an integer ≥ 1", param="max_tokens")
    stream = doc.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequest("stream: must be a boolean", param="stream")
    tier = doc.get("service_tier")
    if tier is not None and (not isinstance(tier, str) or tier not in ANTHROPIC_SERVICE_TIERS):
        raise InvalidRequest(
            "service_tier: must be one of auto, standard_only", param="service_tier"
        )
    return ParsedBody(raw, doc, view=chat_view(doc))
