"""No reference cycle per request: a burst of requests through the ASGI app leaves
nothing for the cyclic collector, so its pauses never stall open streams.

Deterministic, no timing: inside the test, automatic collection is off and
``gc.DEBUG_SAVEALL`` keeps whatever a collection would free in ``gc.garbage``; after a burst
(non-streaming, streaming, errors, a client leaving mid-stream, an engine reset) the unreachable
cycles are counted (the collector then runs again as before). The engine is the raw one of the
capacity benchmark (``loadtests.raw_engine``), in the test's own event loop; the ASGI driver waits
on an ``asyncio.Event`` like uvicorn's ``receive``. Also: ``GcSettings`` and ``GcStats``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
import uvloop

from gateway.app import SpeedgateApp, create_app
from gateway.asgi import DISCONNECT_KEY, DisconnectSignal
from gateway.config import load_config
from gateway.telemetry.gcstats import GEN0, GcSettings, GcStats
from loadtests.raw_engine import Answers, RawHTTP

BURST = 40


class Call:
    """One request through the app as uvicorn drives it: ``receive`` yields the body, then
    blocks on an event until the client leaves (``gone``) or the response ended. With
    ``SIGNAL`` set, the scope carries a ``DisconnectSignal`` as the gateway's own server
    protocol sets it, fired when the client leaves."""

    SIGNAL = False

    def __init__(self, body: bytes, path: str = "/v1/chat/completions") -> None:
        self.body, self.path = body, path
        self.signal = DisconnectSignal() if Call.SIGNAL else None
        self.sent: list[dict[str, Any]] = []
        self.gone = asyncio.Event()
        self.first_body = asyncio.Event()
        self._msgs = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive(self) -> dict[str, Any]:
        if self._msgs:
            return self._msgs.pop()
        await self.gone.wait()
        return {"type": "http.disconnect"}

    def leave(self) -> None:
        self.gone.set()
        if self.signal is not None:
            self.signal.fire()

    async def send(self, msg: dict[str, Any]) -> None:
        self.sent.append(msg)
        if msg["type"] == "http.response.body" and msg.get("body"):
            self.first_body.set()

    async def run(self, app: SpeedgateApp) -> int:
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": self.path,
            "raw_path": self.path.encode(), "query_string": b"", "root_path": "",
            "headers": [(b"content-type", b"application/json"), (b"host", b"gw")],
            "client": ("127.0.0.1", 40000), "server": ("gw", 80), "state": {},
        }  # fmt: skip
        if self.signal is not None:
            scope[DISCONNECT_KEY] = self.signal
        try:
            await app(scope, self.receive, self.send)
        finally:
            self.gone.set()
        return int(self.sent[0]["status"])


def chat(stream: bool, **extra: Any) -> bytes:
    return orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                         "stream": stream, **extra})


async def burst(app: SpeedgateApp, n: int) -> Counter[int]:
    """``n`` rounds of: a JSON answer, a stream, a 400, a 404 (unknown model), a stream the
    client leaves after its first event (the engine holds it open), concurrently."""
    statuses: Counter[int] = Counter()

    async def leave_mid_stream() -> int:
        call = Call(chat(True, user="hold"))
        task = asyncio.ensure_future(call.run(app))
        await call.first_body.wait()
        call.leave()
        return await task

    for _ in range(n):
        got = await asyncio.gather(
            Call(chat(False)).run(app), Call(chat(True)).run(app),
            Call(b'{"model": "m", "messages": 3}').run(app),
            Call(chat(False, model="nope")).run(app), leave_mid_stream(),
        )  # fmt: skip
        statuses.update(got)
    return statuses


@contextlib.asynccontextmanager
async def gateway(
    answers: Answers | None = None, timeouts: dict[str, float] | None = None
) -> AsyncIterator[SpeedgateApp]:
    """The app, started, in front of the raw engine (both in this event loop): ``answers``
    (default 20 chunks per stream, in one write), the pool's ``timeouts`` (default config)."""
    loop = asyncio.get_running_loop()
    answers = answers or Answers("served", 20)
    server = await loop.create_server(lambda: RawHTTP(answers), "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    tier: dict[str, Any] = {"served_model_name": "served", "endpoints": [url]}
    if timeouts is not None:
        tier["timeouts"] = timeouts
    cfg = load_config(health={"enabled": False}, models={"m": {"tiers": {"standard": tier}}})
    gw = create_app(cfg)
    try:
        async with gw.api.router.lifespan_context(gw.api):
            yield gw
    finally:
        server.close()
        await server.wait_closed()


def cycles_found_by_collection() -> list[Any]:
    """What a full collection would free now (not freed: kept for the assertion)."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        found = list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    return found


@pytest.mark.parametrize("signal", [False, True], ids=["watcher-task", "disconnect-signal"])
def test_a_burst_of_requests_leaves_no_reference_cycle(signal: bool) -> None:
    Call.SIGNAL = signal
    try:
        # the gateway's loop (asyncio's own transports keep a cycle per closed connection:
        # ``_read_ready_cb``; uvloop's do not)
        uvloop.run(_burst_leaves_no_cycle())
    finally:
        Call.SIGNAL = False


async def _burst_leaves_no_cycle() -> None:
    async with gateway() as app:
        warm = await burst(app, 3)  # first-use caches (connections, histograms) fill
        assert warm == Counter({200: 9, 400: 3, 404: 3}), warm
        gc.collect()
        gc.disable()
        try:
            statuses = await burst(app, BURST)
            for _ in range(5):  # cancelled tasks finish their last steps
                await asyncio.sleep(0)
            found = cycles_found_by_collection()
        finally:
            gc.enable()
    assert statuses == Counter({200: 3 * BURST, 400: BURST, 404: BURST}), statuses
    kinds = Counter(type(o).__qualname__ for o in found)
    assert not found, f"{len(found)} objects in reference cycles: {kinds.most_common(12)}"


def test_an_engine_reset_leaves_no_reference_cycle() -> None:
    """An engine that dies mid-stream (a cut chunked body: aiohttp's ClientPayloadError from
    TransferEncodingError, its tracebacks through the gateway's reader), for a stream (one
    in-band error: no other replica to resume on) and an assembled JSON answer (502)."""
    uvloop.run(_resets_leave_no_cycle())


async def _resets_leave_no_cycle() -> None:
    def resets() -> list[Any]:
        return [Call(chat(True, user="reset")).run(app), Call(chat(False, user="reset")).run(app)]

    async with gateway() as app:
        for _ in range(2):  # first-use caches fill
            await asyncio.gather(*resets())
        gc.collect()
        gc.disable()
        try:
            statuses: Counter[int] = Counter()
            for _ in range(10):
                statuses.update(await asyncio.gather(*resets()))
            for _ in range(5):
                await asyncio.sleep(0)
            found = cycles_found_by_collection()
        finally:
            gc.enable()
    assert statuses == Counter({200: 10, 502: 10}), statuses
    kinds = Counter(type(o).__qualname__ for o in found)
    assert not found, f"{len(found)} objects in reference cycles: {kinds.most_common(12)}"


async def test_startup_heap_is_frozen_and_thresholds_set_until_shutdown() -> None:
    before = gc.get_threshold()
    async with gateway():
        assert gc.get_threshold()[0] == GEN0
        assert gc.get_freeze_count() > 0
        assert gc.isenabled()
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_settings_restore_what_they_found() -> None:
    before = gc.get_threshold()
    settings = GcSettings()
    settings.settle()
    try:
        assert gc.get_threshold()[0] == GEN0 and gc.get_freeze_count() > 0
    finally:
        settings.restore()
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_two_apps_in_one_process_restore_once_both_stopped() -> None:
    before = gc.get_threshold()
    first, second = GcSettings(), GcSettings()
    first.settle()
    second.settle()
    first.restore()
    assert gc.get_threshold()[0] == GEN0  # the second is still running
    second.restore()
    second.restore()  # idempotent
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_stats_count_collections_per_generation() -> None:
    stats = GcStats()
    stats.install()
    try:
        gc.collect(0)
        gc.collect(2)
    finally:
        stats.uninstall()
    gc.collect(1)  # not counted: uninstalled
    assert stats.collections == [1, 0, 1]
    assert all(p >= 0 for p in stats.pause_s) and stats.max_pause_s >= 0
    names = {m.name for m in stats.collect()}
    assert {"speedgate_process_gc_collections", "speedgate_process_gc_pause_seconds",
            "speedgate_process_gc_pause_max_seconds"} <= names
