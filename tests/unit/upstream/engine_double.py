"""A scripted engine in the test's own event loop, and the gateway app in front of it.

``gateway_on(script, replicas=2)`` starts ``replicas`` aiohttp servers on port 0 (each reports
the port it bound), builds the gateway app on them (one ``standard`` pool, health probes off)
and yields a ``Bench``: an ``httpx.AsyncClient`` on the app (ASGI, no socket), the app itself,
what every replica received, and the app's live state (pools, replicas' outlier state).
``script(request, replica_index)`` answers each ``POST /v1/...``; other paths get 404.
"""

from __future__ import annotations

import contextlib
import gzip
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from aiohttp import web

from gateway.app import SpeedgateApp, create_app
from gateway.config import load_config
from gateway.fleet.pools import Pool
from gateway.state import GatewayState

Script = Callable[[web.Request, int], Awaitable[web.StreamResponse]]


@dataclass
class Seen:
    """One request an engine replica received."""

    replica: int
    headers: dict[str, str]
    doc: dict[str, Any]


@dataclass
class Bench:
    client: httpx.AsyncClient
    state: GatewayState
    app: SpeedgateApp
    seen: list[Seen] = field(default_factory=list)

    @property
    def pool(self) -> Pool:
        (pool,) = self.state.pools.all()
        return pool

    def failures(self) -> list[int]:
        """Consecutive failures outlier detection holds against each replica."""
        return [r.outlier.consecutive_failures for r in self.pool.replicas]


def completion(text: str = "Hello", usage: bool = True) -> dict[str, Any]:
    """A vLLM-shaped chat completion."""
    doc: dict[str, Any] = {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "finish_reason": "stop"}],
    }
    if usage:
        doc["usage"] = {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}
    return doc


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None,
          usage: dict[str, int] | None = None, choices: bool = True) -> bytes:
    """One vLLM-shaped stream chunk as an SSE event."""
    doc: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                           "model": "m"}
    doc["choices"] = ([{"index": 0, "delta": delta or {}, "finish_reason": finish}]
                      if choices else [])
    if usage is not None:
        doc["usage"] = usage
    return b"data: " + orjson.dumps(doc) + b"\n\n"


def gzip_if_asked(request: web.Request, body: bytes) -> web.Response:
    """What an ingress that compresses ``application/json`` does: gzip when the client's
    ``Accept-Encoding`` allows it."""
    if "gzip" in request.headers.get("accept-encoding", ""):
        return web.Response(body=gzip.compress(body), content_type="application/json",
                            headers={"Content-Encoding": "gzip"})
    return web.Response(body=body, content_type="application/json")


async def sse(request: web.Request, events: list[bytes],
              headers: dict[str, str] | None = None) -> web.StreamResponse:
    """Send ``events`` (already framed) as one SSE response."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", **(headers or {})})
    await resp.prepare(request)
    for ev in events:
        await resp.write(ev)
    await resp.write_eof()
    return resp


@contextlib.asynccontextmanager
async def gateway_on(
    script: Script, replicas: int = 2, pool: dict[str, Any] | None = None, **config: Any
) -> AsyncIterator[Bench]:
    seen: list[Seen] = []
    runners: list[web.AppRunner] = []

    def app_for(i: int) -> web.Application:
        async def handle(request: web.Request) -> web.StreamResponse:
            raw = await request.read()
            doc = orjson.loads(raw) if raw else {}  # a cancel has no body
            seen.append(Seen(i, {k.lower(): v for k, v in request.headers.items()}, doc))
            return await script(request, i)

        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/{tail:.*}", handle)
        return app

    try:
        urls = []
        for i in range(replicas):
            runner = web.AppRunner(app_for(i), access_log=None)
            await runner.setup()
            runners.append(runner)
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            urls.append(f"http://127.0.0.1:{runner.addresses[0][1]}")
        cfg = load_config(
            health={"enabled": False},
            models={"m": {"tiers": {"standard": {
                "served_model_name": "m", "endpoints": urls,
                "timeouts": {"connect_s": 2, "ttft_s": 10, "stall_s": 10, "total_s": 30},
                **(pool or {}),
            }}}},
            **config,
        )
        app = create_app(cfg)
        async with app.api.router.lifespan_context(app.api):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gw",
                                         timeout=60) as client:
                yield Bench(client, app.api.state.gateway, app, seen)
    finally:
        for runner in runners:
            await runner.cleanup()
