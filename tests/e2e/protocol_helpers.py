"""Helpers for the Responses and Messages end-to-end tests: request bodies, typed-event
parsing, and each protocol's text, terminal event and in-band error."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from tests.e2e.stack import MODEL


@dataclass(frozen=True)
class Proto:
    """One protocol as the tests see it."""

    name: str
    path: str
    terminal: str  # the event type that ends a complete stream

    def body(self, text: str = "hello", **extra: Any) -> dict[str, Any]:
        """A request body asking about ``text``; ``extra`` fields added (``stream``...)."""
        if self.name == "responses":
            return {"model": MODEL, "input": text, "max_output_tokens": 64, **extra}
        return {"model": MODEL, "max_tokens": 64,
                "messages": [{"role": "user", "content": text}], **extra}

    def text(self, events: list[tuple[str | None, dict[str, Any]]]) -> str:
        """The generated text of a parsed stream."""
        if self.name == "responses":
            return "".join(d["delta"] for _, d in events
                           if d.get("type") == "response.output_text.delta")
        return "".join(d["delta"]["text"] for _, d in events
                       if d.get("type") == "content_block_delta"
                       and d["delta"].get("type") == "text_delta")

    def error(self, doc: dict[str, Any]) -> tuple[str, str]:
        """``(kind, message)`` of an error body or in-band error event: the OpenAI ``code``
        (Responses) or the Anthropic ``error.type`` (Messages)."""
        if self.name == "responses":
            inner = doc.get("error", doc)
            return inner.get("code"), inner.get("message")
        assert doc["type"] == "error", doc
        return doc["error"]["type"], doc["error"]["message"]


RESPONSES = Proto("responses", "/v1/responses", "response.completed")
MESSAGES = Proto("messages", "/v1/messages", "message_stop")
PROTOS = [RESPONSES, MESSAGES]


def parse_events(raw: bytes) -> list[tuple[str | None, dict[str, Any]]]:
    """``(event type line, data)`` of every data event of a raw SSE body (comments and
    ``\\r\\n`` line ends handled)."""
    out = []
    for block in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        name, data = None, []
        for line in block.split(b"\n"):
            if line.startswith(b"event:"):
                name = line[6:].strip().decode()
            elif line.startswith(b"data:"):
                data.append(line[5:].lstrip(b" "))
        if data:
            out.append((name, orjson.loads(b"\n".join(data))))
    return out


def post_stream(
    client: httpx.Client, proto: Proto, body: dict[str, Any], headers: dict | None = None
) -> tuple[httpx.Response, list[tuple[str | None, dict[str, Any]]]]:
    """POST a streaming request; the response and its parsed events (or its JSON error)."""
    with client.stream("POST", proto.path, json=body | {"stream": True},
                       headers=headers or {}) as r:
        raw = r.read()
    if r.status_code != 200:
        return r, [(None, orjson.loads(raw))]
    return r, parse_events(raw)
