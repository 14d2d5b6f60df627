"""The HTTP client to the engines, behind one small interface.

aiohttp was measured faster than httpx as the upstream client under concurrency (see
``loadtests/bench_http_clients.py``, docs/benchmarks.md), so it is the one used. One pooled session
per gateway process; connections to replicas are reused (keep-alive). Closing an
``UpstreamResponse`` before its end closes the TCP connection, which makes vLLM abort the
generation (vLLM frees a request when its client disconnects). Idle connections are kept
``upstream.keepalive_timeout_s`` (4 s by default, below vLLM's 5 s); a request the engine cuts on
a reused connection before any response byte (it closed the idle connection as the request
arrived) is sent once more on a fresh connection, which is no failure of the replica's.
Every request asks for ``Accept-Encoding: identity`` (``gateway.upstream.encoding``: gzip/deflate
from a proxy that compresses anyway are decoded; other codings are ``UpstreamUnreadable``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from types import SimpleNamespace

import aiohttp

from gateway.common.sse import EventTooLarge, SSEEvent, SSEParser
from gateway.config import UpstreamConfig
from gateway.upstream.encoding import ACCEPT_ENCODING, Decoder, UndecodableResponse, decoder_for

MAX_ERROR_BODY_BYTES = 64 * 1024


class UpstreamConnectError(Exception):
    """The replica could not be reached (refused, reset, DNS, connect timeout); ``timeout``
    is True for the connect timeout."""

    def __init__(self, message: str, timeout: bool = False) -> None:
        super().__init__(message)
        self.timeout = timeout


class UpstreamBrokenError(Exception):
    """The connection broke or the payload was cut after the response started."""


class UpstreamUnreadable(Exception):
    """The response arrived but cannot be read, and would not be on any other attempt
    (deterministic): a content coding the gateway cannot decode, or an SSE event over the size
    cap. Not retried, not a replica failure: the client gets one 502."""


class UpstreamResponse:
    """An open response from a replica: ``status``, ``headers``; read the body with
    ``read()`` or iterate SSE events with ``event_batches()``; always ``close()`` (idempotent).
    A body in a content coding (gzip, deflate) is decoded on the way."""

    __slots__ = ("_decoder", "_resp", "_undecodable", "headers", "status")

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status = resp.status
        self.headers = resp.headers
        self._decoder: Decoder | None = None
        self._undecodable: str | None = None
        try:
            self._decoder = decoder_for(resp.headers.get("content-encoding"))
        except UndecodableResponse as e:
            self._undecodable = str(e)

    def _decode(self, chunk: bytes, last: bool = False, limit: int = 0) -> bytes:
        if self._undecodable is not None:
            raise UpstreamUnreadable(self._undecodable)
        if self._decoder is None:
            return chunk
        try:
            out = self._decoder.feed(chunk, limit)
            return out + self._decoder.flush() if last and not limit else out
        except UndecodableResponse as e:
            raise UpstreamUnreadable(str(e)) from None

    async def read(self, limit: int | None = None) -> bytes:
        """The whole body (at most ``limit`` bytes when given), decoded. Raises
        ``UpstreamBrokenError`` (connection), ``UpstreamUnreadable`` (coding)."""
        try:
            if limit is None:
                return self._decode(await self._resp.read(), last=True)
            return self._decode(await self._resp.content.read(limit), limit=limit)
        except (aiohttp.ClientError, ConnectionError) as e:
            raise UpstreamBrokenError(type(e).__name__) from None

    async def event_batches(self) -> AsyncIterator[list[SSEEvent]]:
        """Parsed SSE events, one list per network read (only reads that completed at least
        one event yield). Ends at end of body; a cut connection or an unfinished last event
        raises ``UpstreamBrokenError``; an event over the size cap or a body in a coding the
        gateway cannot decode raises ``UpstreamUnreadable``. Batching lets the relay forward
        everything that arrived together in one write, while still forwarding each event as
        soon as it is complete."""
        parser = SSEParser()
        content = self._resp.content
        broken: str | None = None
        plain = self._decoder is None and self._undecodable is None  # set once, at the head
        try:
            while True:
                chunk = await content.readany()
                if not chunk:
                    break
                events = parser.feed(chunk if plain else self._decode(chunk))
                if events:
                    yield events
            if self._decoder is not None:
                parser.feed(self._decode(b"", last=True))
            tail = parser.close()
            if tail:
                yield tail
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, ConnectionError) as e:
            # a reset: aiohttp's StreamReader keeps the exception, whose traceback frames hold
            # the reader (a reference cycle per reset, left to the cyclic collector): drop the
            # tracebacks of the chain and raise ours outside the handler (no ``__context__``)
            broken = type(e).__name__
            forget_traceback(e)
        except EventTooLarge as e:  # the same bytes on any replica: not worth a retry
            raise UpstreamUnreadable(str(e)) from None
        if broken is not None:
            raise UpstreamBrokenError(broken)
        if parser.has_partial:
            raise UpstreamBrokenError("stream ended inside an event")

    def close(self) -> None:
        """Release the response. Before its end this closes the connection (engine aborts)."""
        if not self._resp.closed:
            self._resp.close()


def forget_traceback(exc: BaseException) -> None:
    """Clear ``__traceback__`` of ``exc`` and of every exception chained to it (``__cause__``,
    ``__context__``), once the gateway converted it into its own: the frames a traceback holds
    often hold the object that keeps the exception (a reference cycle per failure)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        e.__traceback__ = None
        todo += (e.__cause__, e.__context__)


class Upstream:
    """Pooled aiohttp session to all replicas; ``close()`` it.

    aiohttp binds its session to the running event loop: built inside one (a test, a tool) the
    session opens at once; built before the server's loop runs (``create_app``), it opens in the
    app's lifespan with ``open()``. ``post``/``get`` before it is open raise ``RuntimeError``."""

    def __init__(self, config: UpstreamConfig) -> None:
        self.config = config
        self._session: aiohttp.ClientSession | None = None
        self._fresh: aiohttp.ClientSession | None = None  # new connections only (resends)
        self.resent = 0  # requests sent again after an engine closed a reused connection
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop yet: the lifespan opens it
        self.open()

    def open(self) -> None:
        """Create the pooled session in the running loop (no-op when it is open already)."""
        if self._session is not None:
            return
        reuse = aiohttp.TraceConfig()
        reuse.on_connection_reuseconn.append(_mark_reused)
        self._session = self._new_session(force_close=False, traces=[reuse])

    def _new_session(self, force_close: bool,
                     traces: list[aiohttp.TraceConfig] | None = None) -> aiohttp.ClientSession:
        """A session on its own pool: kept-alive connections, or (``force_close``) one new
        connection per request."""
        config = self.config
        connector = aiohttp.TCPConnector(
            limit=config.max_connections,
            limit_per_host=0,
            keepalive_timeout=None if force_close else config.keepalive_timeout_s,
            force_close=force_close,
            enable_cleanup_closed=True,
            ttl_dns_cache=300,
        )
        return aiohttp.ClientSession(
            connector=connector,
            # the gateway reads every body: no compression asked for, any it gets decoded here
            headers={"Accept-Encoding": ACCEPT_ENCODING},
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
            timeout=aiohttp.ClientTimeout(total=None),
            trace_configs=traces,
        )

    @property
    def session(self) -> aiohttp.ClientSession:
        """The open session; ``RuntimeError`` before ``open()``."""
        if self._session is None:
            raise RuntimeError("Upstream.open() was not called (no running loop at creation)")
        return self._session

    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str], connect_timeout_s: float
    ) -> UpstreamResponse:
        """POST ``body`` to ``url`` and return once the response status and headers arrived.

        Raises ``UpstreamConnectError`` when the connection fails or takes longer than
        ``connect_timeout_s``, ``UpstreamBrokenError`` when it breaks before the headers.
        The caller bounds the wait for headers (TTFT, deadline) with its own timeout.

        A request cut on a reused connection before any response byte (the engine closed the
        idle connection as the request arrived: HTTP/1.1 lets a server close an idle connection
        at any time, RFC 9112 §9.3.1, and uvicorn does after ``timeout_keep_alive``) is sent once
        more on a new connection (counted in ``resent``); the engine never saw it, so this is
        no failure of the replica's and no retry of the request's.
        """
        timeout = aiohttp.ClientTimeout(
            total=None, connect=connect_timeout_s, sock_connect=connect_timeout_s
        )
        seen = SimpleNamespace(reused=False)
        try:
            try:
                resp = await self.session.post(
                    url, data=body, headers=headers, timeout=timeout, allow_redirects=False,
                    trace_request_ctx=seen,
                )
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
                if not seen.reused or isinstance(e, aiohttp.ClientConnectorError):
                    raise
                self.resent += 1
                if self._fresh is None:
                    self._fresh = self._new_session(force_close=True)
                resp = await self._fresh.post(
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
        """GET ``url`` with an overall timeout; returns (status, decoded body; empty when its
        coding cannot be decoded: the status still answers a probe). Raises like ``post``."""
        try:
            async with self.session.get(
                url, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as resp:
                try:
                    return resp.status, await UpstreamResponse(resp).read()
                except UpstreamUnreadable:
                    return resp.status, b""
        except UpstreamBrokenError as e:
            raise UpstreamConnectError(str(e)) from None
        except (TimeoutError, aiohttp.ClientError, ConnectionError) as e:
            raise UpstreamConnectError(_describe(e)) from None

    async def close(self) -> None:
        """Close every pooled connection (no-op when it was never opened)."""
        if self._session is not None:
            await self._session.close()
        if self._fresh is not None:
            await self._fresh.close()


async def _mark_reused(session: aiohttp.ClientSession, ctx: SimpleNamespace,
                       params: aiohttp.TraceConnectionReuseconnParams) -> None:
    """Trace hook: the request (its ``trace_request_ctx``) goes out on a pooled connection."""
    if isinstance(ctx.trace_request_ctx, SimpleNamespace):
        ctx.trace_request_ctx.reused = True


def _describe(e: BaseException) -> str:
    """A short description without the URL (it may carry credentials)."""
    if isinstance(e, aiohttp.ClientConnectorError):
        return f"cannot connect ({e.os_error.__class__.__name__})"
    if isinstance(e, asyncio.TimeoutError | aiohttp.ServerTimeoutError):
        return "timeout"
    return type(e).__name__
