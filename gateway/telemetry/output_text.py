"""The text a response generated, read back from what was relayed: what the gateway counts
as output tokens when an engine reports no usage (``gateway.telemetry.tokencount``)."""

from __future__ import annotations

from typing import Any

import orjson


def completion_text(chunks: list[bytes]) -> str:
    """The generated text of relayed stream chunks (SSE ``data`` payloads, JSON), for counting
    output tokens of a stream that ended without usage: every choice's ``delta.content``,
    ``delta.reasoning`` (vLLM ≥ 0.32) or ``reasoning_content``, tool-call ``arguments`` and
    names (chat) or ``text`` (completions). Payloads that are not JSON objects (``[DONE]``,
    errors) are skipped."""
    parts: list[str] = []
    for data in chunks:
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        choices = doc.get("choices") if isinstance(doc, dict) else None
        if not isinstance(choices, list):
            continue
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            if isinstance(choice.get("text"), str):
                parts.append(choice["text"])
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                continue
            for key in ("content", "reasoning", "reasoning_content"):
                if isinstance(delta.get(key), str):
                    parts.append(delta[key])
            for call in delta.get("tool_calls") or ():
                fn = call.get("function") if isinstance(call, dict) else None
                if isinstance(fn, dict):
                    parts.extend(
                        v for k in ("name", "arguments") if isinstance(v := fn.get(k), str)
                    )
    return "".join(parts)


def response_text(doc: dict[str, Any]) -> str:
    """The generated text of a non-streaming response document: every choice's
    ``message.content``, ``message.reasoning`` or ``reasoning_content`` and tool-call names
    and ``arguments`` (chat) or ``text`` (completions)."""
    parts: list[str] = []
    for choice in doc.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        if isinstance(choice.get("text"), str):
            parts.append(choice["text"])
        msg = choice.get("message")
        if not isinstance(msg, dict):
            continue
        for key in ("content", "reasoning", "reasoning_content"):
            if isinstance(msg.get(key), str):
                parts.append(msg[key])
        for call in msg.get("tool_calls") or ():
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict):
                parts.extend(v for k in ("name", "arguments") if isinstance(v := fn.get(k), str))
    return "".join(parts)
