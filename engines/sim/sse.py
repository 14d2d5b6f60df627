"""SSE event writer: ``data: {json}\\n\\n`` framing (with an ``event: <type>`` line first for the
Responses and Messages APIs), with the stream faults applied.

The plain path writes each event as one HTTP chunk. Fault paths (see :mod:`engines.sim.faults`):
CRLF framing, a JSON split over two ``data:`` lines, ``: keepalive`` comments, TCP writes cut
inside multi-byte UTF-8 characters, and the counted faults (stall, malformed event, reset).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable

from aiohttp import web

from engines.sim.faults import Faults
from engines.sim.protocol import error_body

MALFORMED = b'data: {"id": broken'
_LEAD = re.compile(rb"[\xc0-\xff]")  # lead byte of a multi-byte UTF-8 character


class ConnectionReset(Exception):
    """Raised after the writer aborted the TCP connection (fault ``reset_after_chunks``)."""


class ErrorEventSent(ConnectionReset):
    """Raised after the writer sent vLLM's in-stream error event and ``[DONE]`` (fault
    ``error_after_chunks``): generation stops; the stream is otherwise well formed."""


def utf8_cuts(data: bytes) -> list[int]:
    """Offsets that fall *inside* multi-byte characters: after the 2nd byte of 3- and 4-byte
    characters (Hangul syllables, emoji), after the 1st byte of 2-byte ones."""
    cuts = []
    for m in _LEAD.finditer(data):
        lead = data[m.start()]
        cuts.append(m.start() + (1 if lead < 0xE0 else 2))
    return cuts


class EventWriter:
    """Writes the events of one streamed response and counts its content events."""

    __slots__ = ("_eol", "_sep", "content_events", "error_event", "faults", "plain", "request",
                 "resp")

    def __init__(self, request: web.Request, resp: web.StreamResponse, faults: Faults,
                 error_event: Callable[[str, int, str | None], bytes] | None = None) -> None:
        """``error_event(message, status, type)``: the whole in-stream error event of an API
        of typed events (Messages: ``event: error``); None: vLLM's OpenAI ``data:`` error."""
        self.error_event = error_event
        self.request = request
        self.resp = resp
        self.faults = faults
        self.plain = not faults.touches_stream
        self.content_events = 0
        self._eol = b"\r\n" if faults.crlf else b"\n"
        self._sep = self._eol * 2

    async def prefill(self, ping: bytes = b": ping\n\n") -> None:
        """The ``ttft_delay_s`` wait (seconds, wall clock), with ``ping`` (a whole SSE event)
        written every ``prefill_pings_s`` of it when that is set."""
        f = self.faults
        left = f.ttft_delay_s or 0.0
        every = f.prefill_pings_s
        while every is not None and left > every:
            await asyncio.sleep(every)
            left -= every
            await self.resp.write(ping)
        if left > 0:
            await asyncio.sleep(left)

    async def event(self, payload: bytes, name: bytes | None = None) -> None:
        """Write one non-content event (role chunk, usage chunk, ``response.created``...);
        ``name``: its ``event:`` type line, when the API has one."""
        if self.plain:
            await self.resp.write(_head(name, b"\n") + b"data: " + payload + b"\n\n")
        else:
            await self._write_framed(payload, name=name)

    async def content(self, payload: bytes, name: bytes | None = None) -> None:
        """Write one content event, then apply the counted faults."""
        if self.plain:
            await self.resp.write(_head(name, b"\n") + b"data: " + payload + b"\n\n")
            self.content_events += 1
            return
        await self._write_framed(payload, name=name)
        self.content_events += 1
        await self.after_content()

    async def done(self) -> None:
        """Write ``data: [DONE]``."""
        if self.plain:
            await self.resp.write(b"data: [DONE]\n\n")
        else:
            await self._write_framed(b"[DONE]", split=False)

    async def after_content(self) -> None:
        """Apply the faults due after ``content_events`` events (also called with 0 at start)."""
        f, n = self.faults, self.content_events
        if f.malformed_after_chunks == n:
            await self.resp.write(MALFORMED + self._sep)
        if f.stall_after_chunks == n and f.stall_s:
            await asyncio.sleep(f.stall_s)
        if f.error_after_chunks == n:
            message = f.error_message or "error during generation"
            if self.error_event is not None:
                await self.resp.write(self.error_event(message, f.error_code, f.error_type))
                raise ErrorEventSent
            # vLLM's create_streaming_error_response: {"error": {..., "code": status}}
            err = error_body(message, f.error_code, type_=f.error_type)
            await self.resp.write(b"data: " + err + self._sep + b"data: [DONE]" + self._sep)
            raise ErrorEventSent
        if f.reset_after_chunks == n:
            transport = self.request.transport
            if transport is not None:
                transport.abort()
            raise ConnectionReset

    async def _write_framed(
        self, payload: bytes, split: bool = True, name: bytes | None = None
    ) -> None:
        f, eol = self.faults, self._eol
        if f.comments:
            await self.resp.write(b": keepalive" + self._sep)
        head = b"" if f.no_event_lines else _head(name, eol)
        if f.multiline_data and split:
            cut = payload.find(b',"') + 1
            if cut > 0:
                frame = head + b"data: " + payload[:cut] + eol + b"data: " + payload[cut:]
                frame += self._sep
            else:
                frame = head + b"data: " + payload + self._sep
        else:
            frame = head + b"data: " + payload + self._sep
        if f.utf8_split:
            cuts = utf8_cuts(frame)
            if cuts:
                start = 0
                for cut in cuts:
                    await self.resp.write(frame[start:cut])
                    await asyncio.sleep(f.split_pause_s)
                    start = cut
                await self.resp.write(frame[start:])
                return
        await self.resp.write(frame)


def _head(name: bytes | None, eol: bytes) -> bytes:
    return b"" if name is None else b"event: " + name + eol
