"""The HTTP client to the engines, behind one small interface.

aiohttp was measured faster than httpx as the upstream client under concurrency (see
``loadtests/bench_http_clients.py`` and the README), so it is the one used. One pooled session
per gateway process; connections to replicas are reused (keep-alive). Closing an
``UpstreamResponse`` before its end closes the TCP connection, which makes vLLM abort the
generation (vLLM frees a request when its client disconnects).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

import aiohttp

from gateway.config import UpstreamConfig
from gateway.relay.sse import EventTooLarge, SSEEvent, SSEParser

MAX_ERROR_BODY_BYTES = 64 * 1024


class UpstreamConnectError(Exception):
    """The replica could not be reached (refused, reset, DNS, connect timeout); ``timeout``
    is True for the connect timeout."""

    def __init__(self, message: str, timeout: bool = False) -> None:
        super().__init__(message)
        self.timeout = timeout


class UpstreamBrokenError(Exception):
    """The connection broke or the payload was cut after the response started."""


class UpstreamResponse:
    """An open response from a replica: ``status``, ``headers``; read the body with
    ``read()`` or iterate SSE events with ``event_batches()``; always ``close()`` (idempotent)."""

    __slots__ = ("_resp", "headers", "status")

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status = resp.status
        self.headers = resp.headers

    async def read(self, limit: int | None = None) -> bytes:
        """The whole body (at most ``limit`` bytes when given). Raises ``UpstreamBrokenError``."""
        try:
            if limit is None:
                return await self._resp.read()
            return await self._resp.content.read(limit)
        except (aiohttp.ClientError, ConnectionError) as e:
            raise UpstreamBrokenError(type(e).__name__) from None

    async def event_batches(self) -> AsyncIterator[list[SSEEvent]]:
        """Parsed SSE events, one list per network read (only reads that completed at least
        one event yield). Ends at end of body; a cut connection or an unfinished last event
        raises ``UpstreamBrokenError``. Batching lets the relay forward everything that arrived
        together in one write, while still forwarding each event as soon as it is complete."""
        parser = SSEParser()
        content = self._resp.content
        try:
            while True:
                chunk = await content.readany()
                if not chunk:
                    break
                events = parser.feed(chunk)
                if events:
                    yield events
            tail = parser.close()
            if tail:
                yield tail
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, ConnectionError) as e:
            raise UpstreamBrokenError(type(e).__name__) from None
        except EventTooLarge as e:
            raise UpstreamBrokenError(str(e)) from None
        if parser.has_partial:
            raise UpstreamBrokenError("stream ended inside an event")

    def close(self) -> None:
        """Release the response. Before its end this closes the connection (engine aborts)."""
        if not self._resp.closed:
            self._resp.close()


class Upstream:
    """Pooled aiohttp session to all replicas. Create inside the running loop; ``close()``."""

    def __init__(self, config: UpstreamConfig) -> None:
        connector = aiohttp.TCPConnector(
            limit=config.max_connections,
            limit_per_host=0,
            keepalive_timeout=config.keepalive_timeout_s,
            enable_cleanup_closed=True,
            ttl_dns_cache=300,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
            timeout=aiohttp.ClientTimeout(total=None),
        )

    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str], connect_timeout_s: float
    ) -> UpstreamResponse:
        """POST ``body`` to ``url`` and return once the response status and headers arrived.

        Raises ``UpstreamConnectError`` when the connection fails or takes longer than
        ``connect_timeout_s``, ``UpstreamBrokenError`` when it breaks before the headers.
        The caller bounds the wait for headers (TTFT, deadline) with its own timeout.
        """
        timeout = aiohttp.ClientTimeout(
            total=None, connect=connect_timeout_s, sock_connect=connect_timeout_s
        )
        try:
            resp = await self._session.post(
                url, data=body, headers=headers, timeout=timeout, allow_redirects=False
            )
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as e:
            raise UpstreamConnectError(_describe(e)) from None
        except TimeoutError:
            raise UpstreamConnectError("connect timeout") from None
        except (aiohttp.ClientError, ConnectionError) as e:
            raise UpstreamBrokenError(type(e).__name__) from None
        return UpstreamResponse(resp)

    async def get(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        """GET ``url`` with an overall timeout; returns (status, body). Raises like ``post``."""
        try:
            async with self._session.get(
                url, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as resp:
                return resp.status, await resp.read()
        except (TimeoutError, aiohttp.ClientError, ConnectionError) as e:
            raise UpstreamConnectError(_describe(e)) from None

    async def close(self) -> None:
        """Close every pooled connection."""
        await self._session.close()


def _describe(e: BaseException) -> str:
    """A short description without the URL (it may carry credentials)."""
    if isinstance(e, aiohttp.ClientConnectorError):
        return f"cannot connect ({e.os_error.__class__.__name__})"
    if isinstance(e, asyncio.TimeoutError | aiohttp.ServerTimeoutError):
        return "timeout"
    return type(e).__name__
