"""Responses API items (OpenAI API reference, "Responses", input and output items): the
``input`` normalised to a list of items, items as a chat-completions conversation (routing keys
and token estimates), and the generated text of output items and stream events (usage
estimates). Pure.

Items handled: messages (``{"role", "content"}`` with or without ``"type": "message"``; content
a string or parts with ``text``), ``function_call`` (``call_id``, ``name``, ``arguments``),
``function_call_output`` (``call_id``, ``output``), ``reasoning`` (``content``/``summary``
texts). A client's items of other types are refused at admission (``gateway.admit.body_schema``
``ResponsesItemType``); any other item met here (a stored turn's) is kept as given and counted by
its JSON.
"""

from __future__ import annotations

from typing import Any

import orjson

DELTA_EVENTS = frozenset({
    "response.output_text.delta",
    "response.reasoning_text.delta",
    "response.reasoning_summary_text.delta",
    "response.function_call_arguments.delta",
    "response.refusal.delta",
    "response.custom_tool_call_input.delta",
})


def input_items(value: Any) -> list[Any]:
    """``input`` as a list of items: a string is one user message."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return list(value) if isinstance(value, list) else []


def _parts_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    out: list[str] = []
    for part in content if isinstance(content, list) else ():
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            out.append(part["text"])
    return "\n".join(out)


def chat_messages(items: list[Any], instructions: Any = None) -> list[dict[str, Any]]:
    """The conversation as chat messages: ``instructions`` as the system message, message
    items by role, function calls as assistant ``tool_calls``, their outputs as ``tool``
    messages, reasoning as assistant text."""
    out: list[dict[str, Any]] = []
    if isinstance(instructions, str) and instructions:
        out.append({"role": "system", "content": instructions})
    for item in items:
        if not isinstance(item, dict):
            out.append({"role": "user", "content": str(item)})
            continue
        kind = item.get("type", "message")
        if kind == "message" or (kind is None and "role" in item):
            text = _parts_text(item.get("content"))
            out.append({"role": item.get("role", "user"), "content": text})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments")}}
            out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else orjson.dumps(output).decode()
            out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
        elif kind == "reasoning":
            text = _parts_text(item.get("content")) or _parts_text(item.get("summary"))
            out.append({"role": "assistant", "content": text})
        else:
            out.append({"role": "user", "content": orjson.dumps(item).decode()})
    return out


def chat_view(doc: dict[str, Any], items: list[Any]) -> dict[str, Any]:
    """The request as a chat-shaped document: ``messages``, ``tools``, ``max_tokens``."""
    return {
        "messages": chat_messages(items, doc.get("instructions")),
        "tools": doc.get("tools"),
        "max_tokens": doc.get("max_output_tokens"),
    }


def output_items_text(items: Any) -> str:
    """Generated text of output items: message text, function names and arguments,
    reasoning text."""
    parts: list[str] = []
    for item in items if isinstance(items, list) else ():
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "function_call":
            for k in ("name", "arguments"):
                if isinstance(item.get(k), str):
                    parts.append(item[k])
        else:
            parts.append(_parts_text(item.get("content")))
    return "".join(parts)


def event_text(doc: dict[str, Any]) -> str:
    """Generated text of one relayed stream event (deltas; a function call's name)."""
    if doc.get("type") in DELTA_EVENTS and isinstance(doc.get("delta"), str):
        return str(doc["delta"])
    item = doc.get("item")
    if isinstance(item, dict) and isinstance(item.get("name"), str):
        return str(item["name"])
    return ""
