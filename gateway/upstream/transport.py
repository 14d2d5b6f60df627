"""The seam between the gateway and its engines: what the steps need of an upstream HTTP client
(``UpstreamClient``) and of one response (``UpstreamReply``), declared as protocols.
``gateway.upstream.client.Upstream`` (aiohttp, pooled) is the one the gateway runs with; a test
may put any object of this shape in its place (``tests/unit/upstream/scripted_upstream.py``
scripts replicas in process, so the retry, resume and failure-case rules are unit tests).

Errors are the client module's: ``UpstreamConnectError`` (not reached), ``UpstreamBrokenError``
(the connection broke), ``UpstreamUnreadable`` (a response no replica would answer readably).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Protocol

from gateway.common.sse import SSEEvent


class UpstreamReply(Protocol):
    """An open response from a replica: ``status`` and ``headers`` arrived; the body is read
    with ``read`` (decoded, at most ``limit`` bytes when given) or as SSE events with
    ``event_batches`` (one list per network read); ``close()`` releases it (before its end it
    closes the connection, which makes the engine abort the generation). Idempotent close."""

    status: int

    @property
    def headers(self) -> Mapping[str, str]:
        """The response headers (case-insensitive lookup)."""
        ...

    async def read(self, limit: int | None = None) -> bytes:
        """The body, or its first ``limit`` bytes."""
        ...

    def event_batches(self) -> AsyncIterator[list[SSEEvent]]:
        """The SSE events, batched by network read."""
        ...

    def close(self) -> None:
        """Release the response (idempotent)."""
        ...


class UpstreamClient(Protocol):
    """The upstream HTTP client: ``post`` returns once status and headers arrived (the caller
    bounds the wait); ``get`` answers a probe (status, body) within ``timeout_s`` seconds."""

    async def post(self, url: str, body: bytes, headers: Mapping[str, str],
                   connect_timeout_s: float) -> UpstreamReply:
        """Send ``body`` to ``url``; raises ``UpstreamConnectError``/``UpstreamBrokenError``."""
        ...

    async def get(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        """``(status, body)`` of ``GET url``; raises ``UpstreamConnectError``."""
        ...

    async def close(self) -> None:
        """Close every connection."""
        ...
