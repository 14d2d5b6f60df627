"""The engine's token count of a continuation's carried text (``engine_token_count``, vLLM's
``POST /tokenize``), against a scripted engine on port 0: the count when it answers, None
(the estimate stays) when it cannot."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.config import UpstreamConfig
from gateway.upstream.client import Upstream
from gateway.upstream.tokenize import engine_token_count

Handler = Callable[[web.Request], Awaitable[web.Response]]


async def _count(handler: Handler, texts: tuple[str, ...], timeout_s: float = 2.0,
                 seen: list | None = None) -> int | None:
    async def route(request: web.Request) -> web.Response:
        if seen is not None:
            seen.append(orjson.loads(await request.read()))
        return await handler(request)

    app = web.Application()
    app.router.add_post("/tokenize", route)
    upstream = Upstream(UpstreamConfig())
    try:
        async with TestServer(app, port=0) as server:
            url = str(server.make_url("")).rstrip("/")
            return await engine_token_count(upstream, url, "served", texts, timeout_s)
    finally:
        await upstream.close()


async def _words(request: web.Request) -> web.Response:
    doc = orjson.loads(await request.read())
    n = len(doc["prompt"].split())
    return web.json_response({"count": n, "max_model_len": 100, "tokens": list(range(n))})


async def test_the_counts_of_each_carried_text_are_summed() -> None:
    seen: list = []
    assert await _count(_words, ("think it over", "the fast"), seen=seen) == 5
    assert seen == [{"model": "served", "prompt": "think it over", "add_special_tokens": False},
                    {"model": "served", "prompt": "the fast", "add_special_tokens": False}]


async def test_empty_texts_are_not_asked() -> None:
    seen: list = []
    assert await _count(_words, ("", "one"), seen=seen) == 1
    assert len(seen) == 1


@pytest.mark.parametrize("answer", [
    web.json_response({"error": "not found"}, status=404),
    web.json_response({"count": "7"}),
    web.json_response({"count": True}),
    web.json_response({"count": -1}),
    web.Response(body=b"not json", content_type="application/json"),
    web.Response(body=b"[1, 2]", content_type="application/json"),
])
async def test_an_engine_that_cannot_say_leaves_the_estimate(answer: web.Response) -> None:
    async def handler(request: web.Request) -> web.Response:
        return answer

    assert await _count(handler, ("some text",)) is None


async def test_a_slow_engine_is_not_waited_for() -> None:
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return await _words(request)

    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert await _count(slow, ("some text",), timeout_s=0.2) is None
    assert loop.time() - t0 < 2


async def test_an_unreachable_engine_leaves_the_estimate() -> None:
    upstream = Upstream(UpstreamConfig())
    try:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()  # nothing listens there now: refused
        assert await engine_token_count(upstream, f"http://127.0.0.1:{port}", "m", ("a",),
                                        1.0) is None
    finally:
        await upstream.close()
