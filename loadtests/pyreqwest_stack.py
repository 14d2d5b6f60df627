"""pyreqwest (a Rust HTTP client) in place of aiohttp, for ``loadtests.bench_stack`` only.

The question it answers: does pyreqwest as the upstream client lower the CPU per request and per
relayed event? Not a runtime dependency: this module is imported only by the benchmark, in its
own server processes. Two variants:

- ``floor``: ``loadtests.floor_proxy``'s pass-through with a pyreqwest client
  (``python -m loadtests.pyreqwest_stack floor --upstream URL --port 0 --port-file P``).
- ``gateway``: ``python -m gateway serve`` with ``gateway.upstream.client.Upstream`` replaced by
  ``PyreqwestUpstream`` in this process (``python -m loadtests.pyreqwest_stack gateway serve
  -c CFG --port 0 --port-file P``; one worker: the patch does not reach forked workers).

pyreqwest streams a body incrementally only with its read buffer limit at 0
(``streamed_read_buffer_limit(0)``); otherwise it buffers up to its default limit before the
first chunk reaches Python. A request whose body has ``"stream": true`` is sent streamed with
limit 0, any other as a consumed request (read whole): a byte search, fine for a benchmark.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import aiohttp
from pyreqwest.client import Client, ClientBuilder
from pyreqwest.exceptions import ConnectError, ConnectTimeoutError, PyreqwestError
from pyreqwest.request import StreamRequest

from gateway.config import UpstreamConfig
from gateway.upstream.client import (
    Upstream,
    UpstreamBrokenError,
    UpstreamConnectError,
    UpstreamResponse,
)
from gateway.upstream.encoding import ACCEPT_ENCODING
from loadtests.floor_proxy import FloorProxy, Receive, Scope, Send, read_body
from loadtests.floor_proxy import main as floor_main


def wants_stream(body: bytes) -> bool:
    """True when the JSON ``body`` asks for a stream (``"stream": true``, with or without the
    space): a byte search, not a parse."""
    return b'"stream": true' in body or b'"stream":true' in body


def build_client(max_connections: int | None = None) -> Client:
    """A pooled pyreqwest client (no redirects, no decompression: the bodies pass as they are).
    Build it inside the running loop."""
    b = ClientBuilder().follow_redirects(False).gzip(False).brotli(False).deflate(False)
    return b.max_connections(max_connections).build()


class PyreqwestFloor(FloorProxy):
    """``FloorProxy`` whose upstream client is pyreqwest (streams: read buffer limit 0)."""

    client: Client | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                self.client = build_client()
                await send({"type": "lifespan.startup.complete"})
            if self.client is not None:
                await self.client.close()
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http" or scope["method"] != "POST":
            await super().__call__(scope, receive, send)
            return
        body = await read_body(receive)
        assert self.client is not None
        rb = self.client.post(self.upstream + scope["path"]).body_bytes(body).header(
            "Content-Type", "application/json")
        try:
            if not wants_stream(body):
                r = await rb.build().send()
                data = bytes(await r.bytes())
                await self._head(send, r.status, r.headers.get("content-type"))
                await send({"type": "http.response.body", "body": data})
                return
            async with rb.streamed_read_buffer_limit(0).build_streamed() as r:
                await self._head(send, r.status, r.headers.get("content-type"))
                reader = r.body_reader
                while (chunk := await reader.read_chunk()) is not None:
                    await send({"type": "http.response.body", "body": bytes(chunk),
                                "more_body": True})
                await send({"type": "http.response.body", "body": b""})
        except PyreqwestError:
            await send({"type": "http.response.start", "status": 502, "headers": []})
            await send({"type": "http.response.body", "body": b""})

    @staticmethod
    async def _head(send: Send, status: int, ctype: str | None) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", (ctype or "application/json").encode())]})


class AiohttpShaped:
    """A pyreqwest response in the shape ``UpstreamResponse`` reads from aiohttp's
    (``status``, ``headers``, ``read()``, ``content.readany()``/``content.read(n)``,
    ``closed``, ``close()``), so every rule of ``UpstreamResponse`` (decoding, SSE parsing,
    errors) runs unchanged. A streamed response keeps its open ``StreamRequest`` (``request``),
    closed by ``close()``; a consumed one holds its whole ``body``. pyreqwest errors become
    ``aiohttp.ClientPayloadError`` (what ``UpstreamResponse`` maps to ``UpstreamBrokenError``)."""

    __slots__ = ("_body", "_request", "_resp", "closed", "content", "headers", "status")

    def __init__(self, resp: Any, request: StreamRequest | None, body: bytes | None) -> None:
        self._resp = resp
        self._request = request
        self._body = body
        self.status: int = resp.status
        self.headers: Any = resp.headers
        self.closed = False
        self.content = self

    async def readany(self) -> bytes:
        """The next chunk as pyreqwest hands it over (limit 0: as it arrives); b"" at the end."""
        if self._body is not None:
            body, self._body = self._body, b""
            return body
        try:
            chunk = await self._resp.body_reader.read_chunk()
        except PyreqwestError as e:
            raise aiohttp.ClientPayloadError(type(e).__name__) from None
        return b"" if chunk is None else bytes(chunk)

    async def read(self, limit: int | None = None) -> bytes:
        """The rest of the body, at most ``limit`` bytes when given."""
        out = b""
        while limit is None or len(out) < limit:
            chunk = await self.readany()
            if not chunk:
                break
            out += chunk
        return out if limit is None else out[:limit]

    def close(self) -> None:
        """Release the response; an open stream is closed by a task (pyreqwest's exit is a
        coroutine, ``UpstreamResponse.close()`` is not): its connection is dropped."""
        self.closed = True
        request, self._request = self._request, None
        if request is not None:
            task = asyncio.get_running_loop().create_task(request.__aexit__(None, None, None))
            _CLOSING.add(task)
            task.add_done_callback(_CLOSING.discard)


_CLOSING: set[asyncio.Task[Any]] = set()


class PyreqwestUpstream(Upstream):
    """``Upstream`` with a pyreqwest client; the same interface and errors."""

    def __init__(self, config: UpstreamConfig) -> None:
        self._client: Client | None = None
        super().__init__(config)

    def open(self) -> None:
        """Build the pooled client in the running loop (no-op when open already)."""
        if self._client is None:
            self._client = build_client(self.config.max_connections or None)
            self._session = self._client  # type: ignore[assignment]  # "open" for the base

    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str], connect_timeout_s: float
    ) -> UpstreamResponse:
        """POST ``body``; returns once the head arrived (a stream: with its body still open)."""
        if self._client is None:
            raise RuntimeError("PyreqwestUpstream.open() was not called")
        rb = (self._client.post(url).body_bytes(body)
              .headers({**headers, "Accept-Encoding": ACCEPT_ENCODING}))  # fmt: skip
        try:
            if not wants_stream(body):
                resp = await rb.build().send()
                return UpstreamResponse(AiohttpShaped(resp, None, bytes(await resp.bytes())))
            req = rb.streamed_read_buffer_limit(0).build_streamed()
            resp = await req.__aenter__()
            return UpstreamResponse(AiohttpShaped(resp, req, None))
        except (ConnectError, ConnectTimeoutError) as e:
            raise UpstreamConnectError(type(e).__name__) from None
        except PyreqwestError as e:
            raise UpstreamBrokenError(type(e).__name__) from None

    async def get(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        """GET ``url`` within ``timeout_s`` s; (status, body). Raises ``UpstreamConnectError``."""
        if self._client is None:
            raise RuntimeError("PyreqwestUpstream.open() was not called")
        try:
            resp = await self._client.get(url).timeout(timedelta(seconds=timeout_s)).build().send()
            return resp.status, bytes(await resp.bytes())
        except PyreqwestError as e:
            raise UpstreamConnectError(type(e).__name__) from None

    async def close(self) -> None:
        """Close the client (no-op when never opened)."""
        if self._client is not None:
            await self._client.close()


def main(argv: list[str]) -> int:
    """``floor ARGS`` (floor_proxy's arguments) or ``gateway ARGS`` (the ``speedgate`` CLI's)."""
    if argv[:1] == ["floor"]:
        floor_main(argv[1:], app_type=PyreqwestFloor)
        return 0
    if argv[:1] == ["gateway"]:
        import gateway.picker.runtime
        import gateway.state
        from gateway.cli import main as cli_main

        gateway.state.Upstream = PyreqwestUpstream  # type: ignore[misc]
        gateway.picker.runtime.Upstream = PyreqwestUpstream  # type: ignore[misc]
        return cli_main(argv[1:])
    print("usage: python -m loadtests.pyreqwest_stack floor|gateway ARGS...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
