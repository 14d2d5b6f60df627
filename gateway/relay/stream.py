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
from collections.abc import AsyncIterator
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
    stall_s, total_s, deadline = limits.stall_s, limits.total_s, limits.deadline

    def frame(events: list[SSEEvent], out: list[bytes]) -> bool:
        """Append the client bytes of ``events`` to ``out``; True once the stream is over:
        its last event seen (``result.ok``), or an engine error / malformed event
        (``result.error``, its error event appended)."""
        now = loop.time()
        event = codec.event
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
                    result.error = codec.error
                    result.reason = (Failure.CLIENT_ERROR if is_client_fault(codec.error) else
                                     Failure.ENGINE_ERROR if json_object(ev.data)
                                     else Failure.MALFORMED)
                    result.error_event = data
                    if end_on_error:
                        out.append(data)
                    return True
                out.append(data)
            return False
        finally:  # one tick for the batch's content events (one read: one arrival time)
            if itl is not None and result.events > first:
                itl.tick_many(now, result.events - first)

    async def flush(out: list[bytes]) -> None:
        if out:
            body = out[0] if len(out) == 1 else b"".join(out)
            if body:  # nothing to write (an assembled answer's events): no send at all
                await send({"type": "http.response.body", "body": body, "more_body": True})

    when = min(loop.time() + stall_s, deadline)
    try:
        out: list[bytes] = []
        done = frame(head, out)
        await flush(out)
        if done:
            return _finish(result, codec)
        # the stall window restarts at every read: a deadline that moves (no timer per read)
        async with MovingDeadline(when) as cm:
            async for batch in batches:
                out = []
                done = frame(batch, out)
                await flush(out)
                if done:
                    return _finish(result, codec)
                when = min(loop.time() + stall_s, deadline)
                cm.extend(when)
        result.error = UpstreamError("upstream stream ended before its last event")
        result.reason = Failure.EOF
    except UpstreamBrokenError as e:
        result.error = UpstreamError(f"upstream connection broke mid-stream ({e})")
        result.reason = Failure.BROKEN_STREAM
    except UpstreamUnreadable as e:  # deterministic (e.g. an oversized event): not the replica
        result.error = UnreadableResponse(f"engine response cannot be read mid-stream ({e})")
        result.reason = Failure.UNREADABLE
    except TimeoutError:
        # which limit was in force, not the clock: timers may fire a little early
        if when >= deadline:
            result.error = UpstreamTimeout("total", total_s)
            result.reason = Failure.TOTAL_TIMEOUT
        else:
            result.error = UpstreamTimeout("stall", stall_s)
            result.reason = Failure.STALL_TIMEOUT
    result.error_event = codec.error_event(result.error)
    if end_on_error:
        await send({"type": "http.response.body", "body": result.error_event, "more_body": True})
    return _finish(result, codec)


def _finish(result: StreamResult, codec: StreamCodec) -> StreamResult:
    result.usage = codec.usage
    if result.error is None and codec.error is not None:
        result.error, result.ok = codec.error, False
    return result
