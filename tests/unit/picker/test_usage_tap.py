"""``UsageTap``: the engine's usage read from a response body streamed to the picker, in
chunks cut anywhere, in bounded memory."""

from __future__ import annotations

import json

from gateway.picker.usage_tap import TAIL_BYTES, UsageTap
from gateway.protocols.openai.chat import ChatProtocol

USAGE = {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16,
         "prompt_tokens_details": {"cached_tokens": 4}}


def _feed(tap: UsageTap, data: bytes, step: int) -> None:
    for i in range(0, len(data), step):
        tap.feed(data[i:i + step])


def test_stream_usage_from_the_last_event_with_chunks_cut_anywhere() -> None:
    events = [{"choices": [{"index": 0, "delta": {"content": "x" * 50}}], "usage": None}
              for _ in range(3000)]  # ~250 kB: far past the kept tail
    events.append({"choices": [], "usage": USAGE})
    data = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    data += b"data: [DONE]\n\n"
    for step in (7, 4096, 61_999):
        tap = UsageTap(ChatProtocol(), "text/event-stream; charset=utf-8")
        _feed(tap, data, step)
        u = tap.usage()
        assert u is not None and (u.prompt, u.completion, u.cached) == (11, 5, 4)
        assert len(tap._buf) <= 2 * TAIL_BYTES


def test_json_usage_and_what_has_none() -> None:
    doc = {"id": "c", "object": "chat.completion", "choices": [], "usage": USAGE}
    tap = UsageTap(ChatProtocol(), "application/json")
    _feed(tap, json.dumps(doc).encode(), 10)
    assert tap.usage() is not None and tap.usage().completion == 5  # type: ignore[union-attr]
    for body in (b"{cut", b"", b'{"error": {"message": "x"}}'):
        tap = UsageTap(ChatProtocol(), "application/json")
        tap.feed(body)
        assert tap.usage() is None
    tap = UsageTap(ChatProtocol(), "text/event-stream")
    tap.feed(b"data: [DONE]\n\n")
    assert tap.usage() is None
