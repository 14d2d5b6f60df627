"""The stack's floor: a pass-through proxy on the gateway's own HTTP stack, doing nothing else.

``bench_capacity_core --floor`` runs it beside the gateway to split the gateway's added latency
and CPU into what the HTTP stack costs (uvicorn on uvloop with httptools, an aiohttp client
with a keep-alive pool: what ``gateway.server`` and ``gateway.upstream.client`` use) and what
the gateway's own steps cost (parse, admission, routing, relay rules, telemetry). It forwards
``POST`` bodies byte for byte to ``--upstream`` and streams the answer back unchanged (status,
content type, body chunks as they arrive); ``GET /readyz`` answers ``200``. No parsing, no
rewriting, no error handling beyond a ``502``: not a gateway, a measuring instrument.

Run: ``python -m loadtests.floor_proxy --upstream URL --port 0 --port-file PATH``.
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from engines.procs import die_with_parent, write_port_file

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


async def read_body(receive: Receive) -> bytes:
    """The whole request body from ASGI ``receive`` (every ``http.request`` message joined)."""
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            return body


class FloorProxy:
    """ASGI app: ``POST`` anything → the same path on ``upstream``, relayed unchanged."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.session: aiohttp.ClientSession | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                self.session = aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
                await send({"type": "lifespan.startup.complete"})
            if self.session is not None:
                await self.session.close()
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        if scope["method"] != "POST":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        body = await read_body(receive)
        assert self.session is not None
        try:
            async with self.session.post(self.upstream + scope["path"], data=body,
                                         headers={"Content-Type": "application/json"}) as r:
                ctype = r.headers.get("Content-Type", "application/json").encode()
                await send({"type": "http.response.start", "status": r.status,
                            "headers": [(b"content-type", ctype)]})
                async for chunk in r.content.iter_any():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b""})
        except aiohttp.ClientError:
            await send({"type": "http.response.start", "status": 502, "headers": []})
            await send({"type": "http.response.body", "body": b""})


def main(argv: list[str] | None = None, app_type: type[FloorProxy] = FloorProxy) -> None:
    """Bind ``--host:--port`` (0: any free port, written to ``--port-file``) and serve an
    ``app_type`` (``loadtests.pyreqwest_stack`` passes its pyreqwest variant)."""
    import uvicorn

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--upstream", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--port-file", default="")
    a = p.parse_args(argv)
    die_with_parent()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((a.host, a.port))
    if a.port_file:
        write_port_file(a.port_file, sock.getsockname()[1])
    config = uvicorn.Config(app_type(a.upstream), loop="uvloop", http="httptools",
                            lifespan="on", access_log=False, log_level="warning")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()


def app_from_env() -> FloorProxy:
    """App factory for other ASGI servers (``granian --factory``, ``loadtests.bench_stack``):
    the upstream from ``SPEEDGATE_FLOOR_UPSTREAM``. Raises ``KeyError`` when it is unset."""
    return FloorProxy(os.environ["SPEEDGATE_FLOOR_UPSTREAM"])
