"""Usage read from a response body that Envoy streams to the picker (``response_body_mode``
``STREAMED`` or ``FULL_DUPLEX_STREAMED``), in bounded memory.

A JSON answer is kept whole up to ``MAX_JSON_BYTES`` and its ``usage`` read by the protocol
(``Protocol.json_usage``). An SSE stream keeps only its last ``TAIL_BYTES``: the engine
reports usage in the last data event before ``[DONE]`` (vLLM with ``stream_options:
include_usage``, which the upstream body asks for), so the tail is where it is.
"""

from __future__ import annotations

import orjson

from gateway.common.usage import Usage
from gateway.protocols.base import Protocol

MAX_JSON_BYTES = 4 * 1024 * 1024
TAIL_BYTES = 64 * 1024


class UsageTap:
    """Collects a response body; ``usage`` reads the engine's usage at its end."""

    def __init__(self, protocol: Protocol, content_type: str) -> None:
        self.protocol = protocol
        self.sse = content_type.startswith("text/event-stream")
        self._buf = bytearray()
        self.overflow = False  # a JSON body over MAX_JSON_BYTES: no usage read

    def feed(self, chunk: bytes) -> None:
        """Add one body chunk."""
        if self.sse:
            self._buf += chunk
            if len(self._buf) > 2 * TAIL_BYTES:
                del self._buf[:-TAIL_BYTES]
        elif not self.overflow:
            self._buf += chunk
            if len(self._buf) > MAX_JSON_BYTES:
                self.overflow = True
                self._buf.clear()

    def usage(self) -> Usage | None:
        """The usage of the body fed so far (None: none found, or not readable)."""
        if not self.sse:
            if self.overflow or not self._buf:
                return None
            try:
                doc = orjson.loads(bytes(self._buf))
            except orjson.JSONDecodeError:
                return None
            return self.protocol.json_usage(doc) if isinstance(doc, dict) else None
        for block in reversed(bytes(self._buf).split(b"\n\n")):
            for line in block.split(b"\n"):
                if not line.startswith(b"data:") or b'"usage"' not in line:
                    continue
                try:
                    doc = orjson.loads(line[5:].strip())
                except orjson.JSONDecodeError:
                    continue
                if isinstance(doc, dict) and (u := self.protocol.json_usage(doc)) is not None:
                    return u
        return None
