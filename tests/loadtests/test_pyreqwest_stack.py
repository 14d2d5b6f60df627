"""``loadtests/pyreqwest_stack.py``: the pyreqwest-backed ``Upstream`` the stack benchmark
measures keeps the guarantees of the aiohttp one it stands in for: a stream arrives event by
event (read buffer limit 0), a non-stream body whole, and closing a stream before its end
closes the upstream connection (what makes vLLM abort the generation). pyreqwest is not a
dependency (measured, not adopted): skipped where it is not installed."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("pyreqwest")

from gateway.config.process import UpstreamConfig
from loadtests.pyreqwest_stack import PyreqwestUpstream, wants_stream

EVENT = b"data: x\n\n"


class SlowSSE:
    """A raw HTTP/1.1 server on port 0: answers one chunked SSE event at a time, the next only
    once the client's ``go`` event is set (all at once when ``paced`` is False), until the
    client hangs up (``closed`` set) or ``total`` events were sent (then the chunked body ends
    and it hangs up)."""

    def __init__(self, total: int, paced: bool = True) -> None:
        self.total = total
        self.paced = paced
        self.sent = 0
        self.go = asyncio.Event()
        self.closed = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.readuntil(b"\r\n\r\n")
        self.sent = 0  # events sent on this connection
        w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n")  # fmt: skip
        eof = asyncio.ensure_future(r.read())  # the request body is empty: b"" once closed
        go: asyncio.Future[object] | None = None
        try:
            while self.sent < self.total and not eof.done():
                w.write(b"%x\r\n%s\r\n" % (len(EVENT), EVENT))
                await w.drain()
                self.sent += 1
                if not self.paced:
                    continue
                self.go.clear()
                go = asyncio.ensure_future(self.go.wait())
                await asyncio.wait([eof, go], return_when=asyncio.FIRST_COMPLETED)
                go.cancel()
            if not eof.done():  # the whole body: end it and hang up (connection: close)
                w.write(b"0\r\n\r\n")
                await w.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            eof.cancel()
            if go is not None:
                go.cancel()
            self.closed.set()
            w.close()

    def stop(self) -> None:
        assert self.server is not None
        self.server.close()


async def test_stream_event_by_event_then_early_close_aborts_upstream() -> None:
    srv = SlowSSE(total=1000)
    base = await srv.start()
    up = PyreqwestUpstream(UpstreamConfig())
    try:
        resp = await up.post(base + "/v1/chat/completions", b'{"stream": true}', {}, 5.0)
        assert resp.status == 200
        batches = resp.event_batches()
        for _ in range(3):  # each event reaches Python before the server sends the next
            batch = await asyncio.wait_for(batches.__anext__(), 10)
            assert [e.data for e in batch] == [b"x"]
            srv.go.set()
        resp.close()
        await asyncio.wait_for(srv.closed.wait(), 10)
        assert srv.sent < srv.total  # the upstream stopped: the connection was closed
    finally:
        await up.close()
        srv.stop()


async def test_stream_to_its_end_and_non_stream_whole() -> None:
    srv = SlowSSE(total=3)
    base = await srv.start()
    up = PyreqwestUpstream(UpstreamConfig())
    try:
        resp = await up.post(base + "/x", b'{"stream":true}', {}, 5.0)
        seen = []
        async for batch in resp.event_batches():
            seen += [e.data for e in batch]
            srv.go.set()
        assert seen == [b"x", b"x", b"x"]
        resp.close()
        srv.paced = False
        resp = await up.post(base + "/x", b'{"stream": false}', {}, 5.0)
        assert await resp.read() == EVENT * 3  # chunked framing removed, the body whole
        resp.close()
    finally:
        await up.close()
        srv.stop()


def test_wants_stream() -> None:
    assert wants_stream(b'{"model":"m","stream":true}')
    assert wants_stream(b'{"stream": true}')
    assert not wants_stream(b'{"stream": false}') and not wants_stream(b"{}")
