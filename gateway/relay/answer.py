"""What the client is sent around a relayed answer (a whole JSON answer goes out with
``gateway.asgi.send_response``): the accounting headers of a JSON answer (``usage_headers``),
the one in-band error event that ends a started stream (``end_stream_with_error``), and a
stream's ``send`` that finishes the answer (stores it) before its last event goes out
(``finish_first``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from gateway.common.usage import Usage
from gateway.config import Prices
from gateway.errors import GatewayError
from gateway.protocols.base import Protocol, StreamCodec
from gateway.telemetry.cost import cost_usd


def usage_headers(
    usage: Usage | None, prices: Prices, elapsed_s: float, flex: bool = False
) -> list[tuple[bytes, bytes]]:
    """Per-response accounting headers of a JSON response: tokens, cost (USD; ``flex``: at
    the flex share) and output tokens per second over the upstream time ``elapsed_s``. None
    without usage."""
    if usage is None:
        return []
    out = [
        (b"x-speedgate-prompt-tokens", str(usage.prompt).encode()),
        (b"x-speedgate-cached-tokens", str(usage.cached).encode()),
        (b"x-speedgate-completion-tokens", str(usage.completion).encode()),
        (b"x-speedgate-cost-usd", f"{cost_usd(usage, prices, flex):.8f}".encode()),
    ]
    if elapsed_s > 0:
        rate = f"{usage.completion / elapsed_s:.1f}".encode()
        out.append((b"x-speedgate-output-tokens-per-s", rate))
    return out


async def end_stream_with_error(
    send: Any, protocol: Protocol, codecs: list[StreamCodec], err: GatewayError
) -> None:
    """Best effort: one in-band error event of the protocol's kind (from the stream's codec,
    which numbers events where the protocol does) and the end of a started SSE stream (the
    client may be gone already)."""
    event = codecs[0].error_event(err) if codecs else protocol.error_event(err)
    try:
        await send({"type": "http.response.body", "body": event, "more_body": False})
    except Exception:
        pass


def finish_first(
    send: Any, codec: StreamCodec, finish: Callable[[dict[str, Any]], Awaitable[None]]
) -> Callable[[dict[str, Any]], Awaitable[None]]:
    """``send`` for a stream's client that awaits ``finish(codec.final)`` (the protocol's
    ``finish``: a Responses answer is stored) once, as soon as the codec holds the stream's
    final response object and before the bytes that carry it are sent. A client that sends
    its next turn (``previous_response_id``) the moment it reads ``response.completed`` thus
    finds the response stored, on any gateway process sharing the store. ``finish`` must not
    raise (a store failure is the protocol's to log)."""
    done = False

    async def send_after_finish(message: dict[str, Any]) -> None:
        nonlocal done
        if not done and codec.final is not None:
            done = True
            await finish(codec.final)
        await send(message)

    return send_after_finish
