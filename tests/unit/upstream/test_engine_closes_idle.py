"""An engine that closes an idle keep-alive connection just as the gateway sends the next request
on it (uvicorn, vLLM's server, closes idle connections after ``timeout_keep_alive``, 5 s): the
request is sent again on a new connection, the client gets its answer, and the replica is not
counted as failing nor the request as retried. The engine here closes every connection at the
first byte of its second request, so every reuse is cut, deterministically (no sleeps)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx
import orjson

from gateway.app import create_app
from gateway.config import UpstreamConfig, load_config
from gateway.upstream.client import Upstream, UpstreamBrokenError
from tests.unit.upstream.engine_double import completion


class ClosingEngine:
    """Answers the first request of each connection (keep-alive) and closes the connection,
    unanswered, when a second request arrives on it. ``served``/``cut`` count both."""

    def __init__(self) -> None:
        self.served = 0
        self.cut = 0
        self.server: asyncio.base_events.Server | None = None

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            first = True
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if not first:  # the next request on a kept-alive connection: close it
                    self.cut += 1
                    return
                first = False
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                await reader.readexactly(length)
                body = orjson.dumps(completion("Hello"))
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\nconnection: keep-alive\r\n\r\n" % len(body)
                             + body)
                await writer.drain()
                self.served += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[str]:
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            self.server.close()
            await self.server.wait_closed()


async def test_request_cut_on_a_reused_connection_is_sent_again_on_a_new_one() -> None:
    engine = ClosingEngine()
    async with engine.running() as url:
        upstream = Upstream(UpstreamConfig())
        try:
            for _ in range(4):
                resp = await upstream.post(url + "/v1/chat/completions", b"{}", {}, 2.0)
                assert resp.status == 200 and orjson.loads(await resp.read())["choices"]
                resp.close()
        finally:
            await upstream.close()
    # 1: new; 2: reuse cut, resent new (closed after); 3: new; 4: reuse cut, resent
    assert engine.served == 4 and engine.cut == 2 and upstream.resent == 2


async def test_a_cut_on_a_new_connection_is_still_the_replicas_failure() -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    upstream = Upstream(UpstreamConfig())
    try:
        try:
            await upstream.post(url + "/v1/chat/completions", b"{}", {}, 2.0)
        except UpstreamBrokenError as e:
            assert "ServerDisconnected" in str(e)
        else:
            raise AssertionError("a cut on a new connection must fail")
        assert upstream.resent == 0
    finally:
        await upstream.close()
        server.close()
        await server.wait_closed()


async def test_gateway_answers_every_request_when_the_engine_closes_idle_connections() -> None:
    engine = ClosingEngine()
    async with engine.running() as url:
        cfg = load_config(health={"enabled": False}, models={"m": {"tiers": {"standard": {
            "served_model_name": "m", "endpoints": [url],
            "timeouts": {"connect_s": 2, "ttft_s": 10, "stall_s": 10, "total_s": 30}}}}})
        app = create_app(cfg)
        async with app.api.router.lifespan_context(app.api):
            state = app.api.state.gateway
            (pool,) = state.pools.all()
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gw",
                                         timeout=30) as client:
                for _ in range(4):
                    r = await client.post("/v1/chat/completions", json={
                        "model": "m", "messages": [{"role": "user", "content": "hi"}]})
                    assert r.status_code == 200, r.text
                    assert r.json()["choices"][0]["message"]["content"] == "Hello"
            assert [r.outlier.consecutive_failures for r in pool.replicas] == [0]
    assert engine.cut >= 1  # reused connections were cut (the app may also ask /v1/models)


def test_pool_idle_timeout_is_below_vllms() -> None:
    # vLLM's server closes an idle connection after 5 s (VLLM_HTTP_TIMEOUT_KEEP_ALIVE)
    assert UpstreamConfig().keepalive_timeout_s < 5
