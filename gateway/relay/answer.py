"""What the client is sent around a relayed answer (a whole JSON answer goes out with
``gateway.asgi.send_response``): the accounting headers of a JSON answer (``usage_headers``),
and the one in-band error event that ends a started stream (``end_stream_with_error``)."""

from __future__ import annotations

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
