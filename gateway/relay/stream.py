"""Relay of engine responses to the client: SSE events one by one, unbuffered, and JSON bodies.

Each event is parsed once (to tell content, usage and in-band errors apart) and forwarded with
byte splices. Usage is read wherever the engine puts it (its own chunk, the finish chunk, every
chunk); when the gateway asked for usage on the client's behalf no relayed chunk carries it:
the usage-only chunk is dropped and a ``usage`` field on any other chunk removed. The relay
never invents ``finish_reason`` or ``[DONE]``: a stream cut after it started ends with one
in-band ``data: {"error": {...}}`` event and no ``[DONE]``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.common.usage import Usage
from gateway.errors import GatewayError, UnreadableResponse, UpstreamError, UpstreamTimeout
from gateway.relay.sse import DONE_EVENT, SSEEvent, encode_event
from gateway.telemetry.histograms import GapTimer
from gateway.upstream.client import UpstreamBrokenError, UpstreamUnreadable

SSE_HEADERS: list[tuple[bytes, bytes]] = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


_MISSING = object()


class ChunkRewriter:
    """Rewrites engine JSON chunks for the client: ``model`` back to the client-facing name and
    ``service_tier`` set to the tier that served. Byte splices, no parse."""

    __slots__ = ("_model_new", "_model_old", "_tier_prefix", "client_model", "service_tier")

    def __init__(self, served_model: str, client_model: str, service_tier: str) -> None:
        self.client_model = client_model
        self.service_tier = service_tier
        self._model_old = b'"model":' + orjson.dumps(served_model)
        self._model_new = b'"model":' + orjson.dumps(client_model)
        self._tier_prefix = b'{"service_tier":' + orjson.dumps(service_tier) + b","

    def chunk(self, data: bytes, doc: dict[str, Any]) -> bytes:
        """Rewrite one SSE data payload whose parsed form is ``doc``: byte splices in the
        common case (compact JSON as vLLM writes it), re-serialised otherwise."""
        if self._model_old != self._model_new and doc.get("model") is not None:
            spliced = data.replace(self._model_old, self._model_new, 1)
            if spliced is data or spliced == data:
                return self.body(doc)
            data = spliced
        tier = doc.get("service_tier", _MISSING)
        if tier is _MISSING:
            return self._tier_prefix + data[1:]
        if tier != self.service_tier:
            return self.body(doc)
        return data

    def body(self, doc: dict[str, Any]) -> bytes:
        """Rewrite a non-streaming response document and serialise it."""
        if "model" in doc:
            doc["model"] = self.client_model
        doc["service_tier"] = self.service_tier
        return orjson.dumps(doc)


@dataclass(slots=True)
class StreamResult:
    """How a relayed stream ended: ``ok`` (saw ``[DONE]``), its ``usage`` if the engine sent
    one, the ``error`` sent in-band otherwise, and the number of events relayed."""

    ok: bool = False
    usage: Usage | None = None
    error: GatewayError | None = None
    events: int = 0


def engine_error(doc: dict[str, Any]) -> UpstreamError:
    """The client-facing error for an engine's in-band ``{"error": {...}}`` event (its
    message kept, type ``server_error``, code ``upstream_error``)."""
    inner = doc.get("error")
    message = inner.get("message") if isinstance(inner, dict) else None
    return UpstreamError(f"engine error: {message if isinstance(message, str) else inner}")


def error_event(err: GatewayError) -> bytes:
    """An in-band SSE error event carrying the OpenAI error object."""
    return encode_event(err.to_bytes())


async def relay_events(
    send: Any,
    head: list[SSEEvent],
    batches: AsyncIterator[list[SSEEvent]],
    rewriter: ChunkRewriter,
    *,
    strip_usage: bool,
    stall_s: float,
    total_s: float,
    deadline: float,
    itl: GapTimer | None = None,
    relayed: list[bytes] | None = None,
) -> StreamResult:
    """Send the ``head`` events (read before the attempt was committed) and every following
    batch of events to the client as soon as it is complete: one write per upstream read.

    ``stall_s``: longest allowed gap between upstream reads that complete events (seconds);
    ``deadline``: loop time at which the total deadline (``total_s``) expires. On a broken
    upstream, a stall or the deadline, sends one in-band error event and returns (the caller
    closes the upstream connection so the engine aborts). ``itl`` gets a tick per content event
    sent (inter-token latency); ``relayed`` collects the content payloads sent (references, no
    copies) so usage can be counted if the engine never reports it.
    """
    result = StreamResult()
    loop = asyncio.get_running_loop()

    def frame(events: list[SSEEvent], out: list[bytes]) -> bool:
        """Append the client bytes of ``events`` to ``out``; True once the stream is over:
        ``[DONE]`` seen (``result.ok``), or an engine error event / malformed event
        (``result.error``, its event appended)."""
        now = loop.time()
        for ev in events:
            data = ev.data
            if data is None:
                continue
            if ev.is_done:
                out.append(DONE_EVENT)
                result.ok = True
                return True
            try:
                doc = orjson.loads(data)
            except orjson.JSONDecodeError:
                doc = None
            if not isinstance(doc, dict):
                result.error = UpstreamError("engine sent a malformed event mid-stream")
                out.append(error_event(result.error))
                return True
            choices = doc.get("choices")
            if "error" in doc and not choices:
                result.error = engine_error(doc)
                out.append(error_event(result.error))
                return True
            usage = doc.get("usage")
            if usage is not None:
                # the usage chunk (``choices: []``), or usage on the finish chunk (servers other
                # than vLLM) or on every chunk (vLLM's continuous_usage_stats): the last wins
                result.usage = Usage.from_openai(usage) or result.usage
                if strip_usage:  # the gateway asked for it: the client sees none of it
                    if not choices:
                        continue
                    del doc["usage"]
                    data = orjson.dumps(doc)
            result.events += 1
            if itl is not None:
                itl.tick(now)
            if relayed is not None:
                relayed.append(data)
            out.append(encode_event(rewriter.chunk(data, doc)))
        return False

    async def flush(out: list[bytes]) -> None:
        if out:
            body = out[0] if len(out) == 1 else b"".join(out)
            await send({"type": "http.response.body", "body": body, "more_body": True})

    when = min(loop.time() + stall_s, deadline)
    try:
        out: list[bytes] = []
        done = frame(head, out)
        await flush(out)
        if done:
            return result
        async with asyncio.timeout_at(when) as cm:
            async for batch in batches:
                out = []
                done = frame(batch, out)
                await flush(out)
                if done:
                    return result
                when = min(loop.time() + stall_s, deadline)
                cm.reschedule(when)
        result.error = UpstreamError("upstream stream ended without [DONE]")
    except UpstreamBrokenError as e:
        result.error = UpstreamError(f"upstream connection broke mid-stream ({e})")
    except UpstreamUnreadable as e:  # deterministic (e.g. an oversized event): not the replica
        result.error = UnreadableResponse(f"engine response cannot be read mid-stream ({e})")
    except TimeoutError:
        # which limit was in force, not the clock: timers may fire a little early
        if when >= deadline:
            result.error = UpstreamTimeout("total", total_s)
        else:
            result.error = UpstreamTimeout("stall", stall_s)
    await send({"type": "http.response.body", "body": error_event(result.error), "more_body": True})
    return result
