"""Incremental Server-Sent Events parser and writer (WHATWG HTML spec, "Server-sent events").

The relay works on whole events, never on arbitrary byte cuts: bytes are buffered until a blank
line ends an event, so a multi-byte UTF-8 character cut across TCP writes is forwarded intact.
Nothing is decoded: event data stays ``bytes``.
"""

from __future__ import annotations

from dataclasses import dataclass

DONE = b"[DONE]"
MAX_EVENT_BYTES = 8 * 1024 * 1024  # one chunk of a vLLM stream is well under 1 KiB


class EventTooLarge(ValueError):
    """An event grew past ``max_event_bytes`` without ending: a broken or hostile stream."""


@dataclass(slots=True)
class SSEEvent:
    """One parsed event. ``data`` is the data lines joined with ``\\n`` (None: no data line);
    ``event`` the event type if an ``event:`` field was sent; ``comment`` true for an event made
    only of comment lines (``: keepalive``)."""

    data: bytes | None
    event: bytes | None = None
    comment: bool = False

    @property
    def is_done(self) -> bool:
        """True for OpenAI's stream terminator ``data: [DONE]``."""
        return self.data == DONE


class SSEParser:
    """Feed raw bytes as they arrive; get back the events completed so far.

    Handles ``\\n``, ``\\r\\n`` and ``\\r`` line endings (also mixed, and a ``\\r\\n`` pair cut
    across two feeds), comment lines, multi-line ``data:``, and a field with no space after the
    colon. Cost per feed is linear in the bytes fed.
    """

    __slots__ = ("_buf", "_pending_cr", "max_event_bytes")

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._buf = b""
        self._pending_cr = False
        self.max_event_bytes = max_event_bytes

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Add ``chunk`` and return the events it completed (possibly none)."""
        if not self._buf and not self._pending_cr:
            # the common case, inline: one read holding exactly one whole one-line event (an
            # engine writes each token's event at once) and no ``\r``
            # (``13 in``, an int: a plain memchr, several times faster than ``b"\r" in``)
            end = len(chunk) - 2
            if chunk[-2:] == b"\n\n" and chunk.index(10) == end and 13 not in chunk:
                if chunk[:6] == b"data: ":
                    return [SSEEvent(chunk[6:end])]
                ev = _parse_block(chunk[:end])
                return [ev] if ev is not None else []
        if self._pending_cr:
            chunk = b"\r" + chunk
            self._pending_cr = False
        if 13 in chunk:  # b"\r"
            if chunk.endswith(b"\r"):
                # Could be the first half of "\r\n": decide when the next bytes arrive.
                chunk = chunk[:-1]
                self._pending_cr = True
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buf = self._buf + chunk if self._buf else chunk
        if b"\n\n" not in buf:
            if len(buf) > self.max_event_bytes:
                raise EventTooLarge(f"an SSE event exceeded {self.max_event_bytes} bytes")
            self._buf = buf
            return []
        *blocks, rest = buf.split(b"\n\n")
        if len(rest) > self.max_event_bytes:
            raise EventTooLarge(f"an SSE event exceeded {self.max_event_bytes} bytes")
        self._buf = rest
        events = []
        for block in blocks:
            ev = _parse_block(block)
            if ev is not None:
                events.append(ev)
        return events

    def close(self) -> list[SSEEvent]:
        """End of stream: resolve a held-back ``\r`` and return the events that completes. A
        trailing block with no blank line after it is incomplete and stays (see
        ``has_partial``), as the spec drops it."""
        if not self._pending_cr:
            return []
        self._pending_cr = False
        return self.feed(b"\n")

    @property
    def has_partial(self) -> bool:
        """True when bytes of an unfinished event are buffered."""
        return bool(self._buf.strip(b"\n")) or self._pending_cr


def _parse_block(block: bytes) -> SSEEvent | None:
    """Parse the lines of one event (without its terminating blank line)."""
    if not block:
        return None
    if block[:6] == b"data: " and 10 not in block:  # the common case, one data line
        return SSEEvent(block[6:])
    data: list[bytes] = []
    event: bytes | None = None
    saw_comment = False
    for line in block.split(b"\n"):
        if not line:
            continue
        if line[:1] == b":":
            saw_comment = True
            continue
        name, sep, value = line.partition(b":")
        if sep and value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            data.append(value)
        elif name == b"event":
            event = value
    if data:
        return SSEEvent(b"\n".join(data), event)
    if event is not None:
        return SSEEvent(None, event)
    return SSEEvent(None, comment=True) if saw_comment else None


def encode_event(data: bytes) -> bytes:
    """Frame ``data`` as one SSE event (``data: ...\\n\\n``; one ``data:`` line per line)."""
    if 10 in data:  # b"\n" (an int: a plain memchr)
        return b"".join(b"data: " + line + b"\n" for line in data.split(b"\n")) + b"\n"
    return b"data: " + data + b"\n\n"


DONE_EVENT = b"data: [DONE]\n\n"
