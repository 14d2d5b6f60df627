"""An in-process, scripted stand-in for the upstream client (``gateway.upstream.transport``):
each replica answers from a script, no socket is opened, and the gateway app runs in front of
it through ASGI. So the retry, resume and failure-case rules run as unit tests.

``scripted_gateway(script, replicas=2, pool=...)`` yields a ``ScriptedBench``: the ASGI
client, the live pool, and every call (``Call``: replica index, path, body). ``script(call)``
returns a ``Reply``: a status and JSON body, SSE events (framed bytes, one network read each),
a break after some of them, a refused connection, or no answer at all (``hang``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from multidict import CIMultiDict

from gateway.app import create_app
from gateway.common.sse import SSEEvent, SSEParser
from gateway.config import load_config
from gateway.fleet.pools import Pool
from gateway.upstream.client import UpstreamBrokenError, UpstreamConnectError


@dataclass
class Reply:
    """One scripted answer (module docstring). ``events``: framed SSE bytes, one read each;
    ``break_after``: raise a broken connection after that many reads; ``refuse``: the
    connection is refused; ``hang``: no answer until the attempt's timeout."""

    status: int = 200
    body: Any = None
    events: list[bytes] = field(default_factory=list)
    break_after: int | None = None
    refuse: bool = False
    hang: bool = False
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Call:
    """One request a scripted replica received."""

    replica: int
    path: str
    doc: dict[str, Any]


class ScriptedReply:
    """A ``Reply`` as an ``UpstreamReply``."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.status = reply.status
        kind = "text/event-stream" if reply.events else "application/json"
        self._headers = CIMultiDict({"content-type": kind, **reply.headers})
        self.closed = False

    @property
    def headers(self) -> Mapping[str, str]:
        return self._headers

    async def read(self, limit: int | None = None) -> bytes:
        raw = orjson.dumps(self.reply.body) if self.reply.body is not None else b""
        return raw if limit is None else raw[:limit]

    async def event_batches(self) -> AsyncIterator[list[SSEEvent]]:
        parser = SSEParser()
        for n, chunk in enumerate(self.reply.events):
            if self.reply.break_after is not None and n >= self.reply.break_after:
                raise UpstreamBrokenError("ClientPayloadError")
            events = parser.feed(chunk)
            if events:
                yield events
            await asyncio.sleep(0)
        if self.reply.break_after is not None:
            raise UpstreamBrokenError("ClientPayloadError")

    def close(self) -> None:
        self.closed = True


class ScriptedUpstream:
    """An ``UpstreamClient`` whose replicas (``urls``) answer from ``script``."""

    def __init__(self, urls: list[str], script: Callable[[Call], Reply]) -> None:
        self.urls, self.script = urls, script
        self.calls: list[Call] = []

    async def post(self, url: str, body: bytes, headers: Mapping[str, str],
                   connect_timeout_s: float) -> ScriptedReply:
        index = next(i for i, u in enumerate(self.urls) if url.startswith(u))
        call = Call(index, url[len(self.urls[index]):], orjson.loads(body) if body else {})
        self.calls.append(call)
        reply = self.script(call)
        if reply.refuse:
            raise UpstreamConnectError("cannot connect (ConnectionRefusedError)")
        if reply.hang:
            await asyncio.Event().wait()
        return ScriptedReply(reply)

    async def get(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        raise UpstreamConnectError("no probes in a scripted fleet")

    async def close(self) -> None:
        return None


@dataclass
class ScriptedBench:
    client: httpx.AsyncClient
    upstream: ScriptedUpstream
    pool: Pool

    def failures(self) -> list[int]:
        """Consecutive failures outlier detection holds against each replica."""
        return [r.outlier.consecutive_failures for r in self.pool.replicas]


@contextlib.asynccontextmanager
async def scripted_gateway(script: Callable[[Call], Reply], replicas: int = 2,
                           pool: dict[str, Any] | None = None) -> AsyncIterator[ScriptedBench]:
    # ports nothing listens on: the real client, never used, could not reach them either
    urls = [f"http://127.0.0.1:{9 + i}" for i in range(replicas)]
    cfg = load_config(health={"enabled": False}, models={"m": {"tiers": {"standard": {
        "served_model_name": "m", "endpoints": urls,
        "timeouts": {"connect_s": 1, "ttft_s": 5, "stall_s": 5, "total_s": 10},
        **(pool or {})}}}})
    app = create_app(cfg)
    async with app.api.router.lifespan_context(app.api):
        state = app.api.state.gateway
        scripted = ScriptedUpstream(urls, script)
        # the seam: every step reads the client from the (frozen) state; the real one, opened
        # by the lifespan and never used here, is still closed by it
        object.__setattr__(state, "upstream", scripted)
        (the_pool,) = state.pools.all()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw",
                                     timeout=30) as client:
            yield ScriptedBench(client, scripted, the_pool)


def chat_events(*words: str, usage: dict[str, int] | None = None) -> list[bytes]:
    """A vLLM-shaped chat stream of ``words`` (one event each), a finish, usage, ``[DONE]``."""
    def ev(doc: dict[str, Any]) -> bytes:
        return b"data: " + orjson.dumps({"id": "c1", "object": "chat.completion.chunk",
                                         "created": 1, "model": "m", **doc}) + b"\n\n"

    out = [ev({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                            "finish_reason": None}]})]
    out += [ev({"choices": [{"index": 0, "delta": {"content": w}, "finish_reason": None}]})
            for w in words]
    out.append(ev({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    out.append(ev({"choices": [], "usage": usage or {
        "prompt_tokens": 5, "completion_tokens": len(words), "total_tokens": 5 + len(words)}}))
    return [*out, b"data: [DONE]\n\n"]


def error_event(code: int, message: str) -> bytes:
    """vLLM's in-stream error event (``create_streaming_error_response``)."""
    return b"data: " + orjson.dumps({"error": {"message": message, "type": "BadRequestError",
                                               "code": code}}) + b"\n\n"
