"""Relay of an engine's stream to the client: SSE events one by one, unbuffered, for any
protocol (the protocol's ``StreamCodec`` rewrites each event and says what it is).

The relay never invents an ending (``finish_reason``, ``[DONE]``, ``response.completed``,
``message_stop``): a stream cut after it started ends with one in-band error event of the
protocol's own kind. Usage is read wherever the engine puts it (the codec's concern: for
OpenAI streams its own chunk, the finish chunk or every chunk); when the gateway asked for
usage on the client's behalf no relayed event carries it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from gateway.common.moving_deadline import MovingDeadline
from gateway.common.sse import SSEEvent
from gateway.common.usage import Usage
from gateway.errors import (
    GatewayError,
    UnreadableResponse,
    UpstreamError,
    UpstreamTimeout,
    is_client_fault,
)
from gateway.protocols.base import CONTENT, DONE, ERROR, SKIP, StreamCodec, json_object
from gateway.telemetry.histograms import GapTimer
from gateway.upstream.client import UpstreamBrokenError, UpstreamUnreadable
from gateway.upstream.failures import Failure

SSE_HEADERS: list[tuple[bytes, bytes]] = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


@dataclass(slots=True)
class StreamResult:
    """How a relayed stream ended: ``ok`` (its protocol's last event seen), its ``usage`` if
    the engine sent one, the ``error`` sent in-band otherwise, and the number of content
    events relayed."""

    ok: bool = False
    usage: Usage | None = None
    error: GatewayError | None = None
    events: int = 0
    reason: str | None = None  # how it broke: a ``Failure`` (broken-stream, eof, stall-timeout…)
    error_event: bytes = b""  # the in-band error event for ``error`` (sent unless resumed)


@dataclass(frozen=True, slots=True)
class StreamLimits:
    """The time limits of one relayed stream (an attempt's, ``Attempt``): ``stall_s`` the
    longest allowed gap between upstream reads that complete events (seconds), ``deadline``
    the loop time at which the total deadline of ``total_s`` seconds expires."""

    stall_s: float
    total_s: float
    deadline: float


async def relay_events(
    send: Any,
    head: list[SSEEvent],
    batches: AsyncIterator[list[SSEEvent]],
    codec: StreamCodec,
    limits: StreamLimits,
    *,
    itl: GapTimer | None = None,
    relayed: list[bytes] | None = None,
    end_on_error: bool = True,
) -> StreamResult:
    """Send the ``head`` events (read before the attempt was committed) and every following
    batch of events to the client as soon as it is complete: one write per upstream read.

    ``codec`` (the protocol's, for this stream) rewrites each event and classifies it.
    ``limits``: the stall timeout and the total deadline (``StreamLimits``). On a broken
    upstream, a stall or the deadline, sends one in-band error event and returns (the caller
    closes the upstream connection so the engine aborts). ``itl`` gets a tick per content event
    sent (inter-token latency); ``relayed`` collects the content payloads sent (references, no
    copies) so usage can be counted if the engine never reports it, and a broken stream's
    output rebuilt for a resume. ``end_on_error`` false: a failure's error event is left in
    ``result.error_event`` for the caller (who may continue the stream instead), with
    ``result.reason`` saying how the stream broke.
    """
    result = StreamResult()
    loop = asyncio.get_running_loop()
    framer = _Framer(codec, result, loop.time, itl, relayed, end_on_error)
    stall_s, deadline = limits.stall_s, limits.deadline
    when = min(loop.time() + stall_s, deadline)
    try:
        out: list[bytes] = []
        done = framer.frame(head, out)
        await _flush(send, out)
        if done:
            return _finish(result, codec)
        # the stall window restarts at every read: a deadline that moves (no timer per read)
        async with MovingDeadline(when) as cm:
            async for batch in batches:
                out = []
                done = framer.frame(batch, out)
                await _flush(send, out)
                if done:
                    return _finish(result, codec)
                when = min(loop.time() + stall_s, deadline)
                cm.extend(when)
        result.error = UpstreamError("upstream stream ended before its last event")
        result.reason = Failure.EOF
    except (UpstreamBrokenError, UpstreamUnreadable, TimeoutError) as e:
        # which limit was in force, not the clock: timers may fire a little early
        result.error, result.reason = _broken(e, limits, total=when >= deadline)
    result.error_event = codec.error_event(result.error)
    if end_on_error:
        await send({"type": "http.response.body", "body": result.error_event, "more_body": True})
    return _finish(result, codec)


@dataclass(slots=True)
class _Framer:
    """The client bytes of one stream's events: ``codec`` rewrites and classifies each,
    ``result`` counts them and takes the end (its last event, or an engine error / malformed
    event); ``now`` the loop's clock, ``itl``, ``relayed`` and ``end_on_error`` as in
    ``relay_events``."""

    codec: StreamCodec
    result: StreamResult
    now: Callable[[], float]
    itl: GapTimer | None
    relayed: list[bytes] | None
    end_on_error: bool

    def frame(self, events: list[SSEEvent], out: list[bytes]) -> bool:
        """Append the client bytes of ``events`` to ``out``; True once the stream is over:
        its last event seen (``result.ok``), or an engine error / malformed event
        (``result.error``, its error event appended unless the caller sends it)."""
        result, relayed = self.result, self.relayed
        now = self.now()
        event = self.codec.event
        first = result.events
        try:
            for ev in events:
                if ev.data is None:
                    continue
                verdict, data = event(ev)
                if verdict == CONTENT:
                    result.events += 1
                    if relayed is not None:
                        relayed.append(ev.data)
                elif verdict == SKIP:
                    continue
                elif verdict == DONE:
                    out.append(data)
                    result.ok = True
                    return True
                elif verdict == ERROR:
                    self._engine_error(ev.data, data, out)
                    return True
                out.append(data)
            return False
        finally:  # one tick for the batch's content events (one read: one arrival time)
            if self.itl is not None and result.events > first:
                self.itl.tick_many(now, result.events - first)

    def _engine_error(self, payload: bytes, data: bytes, out: list[bytes]) -> None:
        """Record the codec's error of an ``ERROR`` event (``payload`` its data, ``data`` the
        client's error event): a client fault, the engine's error, or a malformed event."""
        result, error = self.result, self.codec.error
        result.error = error
        result.reason = (Failure.CLIENT_ERROR if is_client_fault(error) else
                         Failure.ENGINE_ERROR if json_object(payload) else Failure.MALFORMED)
        result.error_event = data
        if self.end_on_error:
            out.append(data)


async def _flush(send: Any, out: list[bytes]) -> None:
    """Write ``out`` as one body message (none when it holds no bytes: an assembled answer's
    events)."""
    if out:
        body = out[0] if len(out) == 1 else b"".join(out)
        if body:
            await send({"type": "http.response.body", "body": body, "more_body": True})


def _broken(
    e: UpstreamBrokenError | UpstreamUnreadable | TimeoutError, limits: StreamLimits, *,
    total: bool,
) -> tuple[GatewayError, Failure]:
    """The error sent in-band and the ``Failure`` of a stream that broke with ``e``: the
    connection broke, an event could not be read (deterministic, e.g. oversized: not the
    replica's fault), or a timeout, the total one when ``total`` (its deadline was the limit
    in force), else the stall one."""
    if isinstance(e, UpstreamBrokenError):
        return (UpstreamError(f"upstream connection broke mid-stream ({e})"),
                Failure.BROKEN_STREAM)
    if isinstance(e, UpstreamUnreadable):
        return (UnreadableResponse(f"engine response cannot be read mid-stream ({e})"),
                Failure.UNREADABLE)
    if total:
        return UpstreamTimeout("total", limits.total_s), Failure.TOTAL_TIMEOUT
    return UpstreamTimeout("stall", limits.stall_s), Failure.STALL_TIMEOUT


def _finish(result: StreamResult, codec: StreamCodec) -> StreamResult:
    result.usage = codec.usage
    if result.error is None and codec.error is not None:
        result.error, result.ok = codec.error, False
    return result
