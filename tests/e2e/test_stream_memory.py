"""Case stream-memory: after many streams and a batch of failing requests that retry and fall
back, the gateway's tasks and threads return to their baseline and RSS settles near it.

Scaled to CI: 2,000 streams of 200 chunks at concurrency 50 (the case says 10,000); the same
kind of leak (a task, a buffer, a log record per chunk or per request) shows at this size.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.e2e.helpers import CHAT, metric, wait_for
from tests.e2e.stack import MODEL, Stack

pytestmark = pytest.mark.e2e

STREAMS = 2000
CONCURRENCY = 50
CHUNKS = ["x"] * 200


def _gauges(stack: Stack) -> tuple[float, float, float]:
    return (_plain(stack, "tasks"), _plain(stack, "threads"),
            _plain(stack, "resident_memory_bytes"))


def _plain(stack: Stack, what: str) -> float:
    name = f"speedgate_process_{'asyncio_' if what == 'tasks' else ''}{what}"
    for line in httpx.get(stack.base_url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not exported")


async def _drive(base_url: str, n: int, body: dict) -> list[int]:
    statuses: list[int] = []
    limits = httpx.Limits(max_connections=CONCURRENCY)
    async with httpx.AsyncClient(base_url=base_url, timeout=60, limits=limits) as c:
        todo = list(range(n))

        async def worker() -> None:
            while todo:
                todo.pop()
                async with c.stream("POST", CHAT, json=body) as r:
                    async for _ in r.aiter_raw():
                        pass
                    statuses.append(r.status_code)

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return statuses


def test_stream_memory(tmp_path):
    stack = Stack(tmp_path, sim_args=("--time-scale", "0"),
                  timeouts={"connect_s": 2, "ttft_s": 10, "stall_s": 10, "total_s": 60})
    stack.start()
    try:
        ok_body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "x"}],
                   "sim_faults": {"chunks": CHUNKS}}
        assert set(asyncio.run(_drive(stack.base_url, 200, ok_body))) == {200}  # warm up
        time.sleep(1)
        tasks0, threads0, rss0 = _gauges(stack)
        t0 = time.monotonic()
        assert set(asyncio.run(_drive(stack.base_url, STREAMS, ok_body))) == {200}
        elapsed = time.monotonic() - t0
        # failing requests: the fast pool answers 503 everywhere, each request retries there
        # and falls back to standard
        for url in stack.sims["fast"]:
            httpx.post(url + "/sim/faults", json={"status": 503}).raise_for_status()
        failing = {**ok_body, "model": f"{MODEL}-fast"}
        assert set(asyncio.run(_drive(stack.base_url, 300, failing))) == {200}
        assert metric(stack, "speedgate_fallbacks_total") >= 1
        assert wait_for(lambda: _plain(stack, "tasks") <= tasks0, timeout_s=10), (
            _plain(stack, "tasks"), tasks0)
        tasks1, threads1, rss1 = _gauges(stack)
        print(f"stream-memory: {STREAMS} streams in {elapsed:.1f}s; tasks {tasks0:.0f} -> "
              f"{tasks1:.0f}, threads {threads0:.0f} -> {threads1:.0f}, RSS "
              f"{rss0 / 2**20:.1f} -> {rss1 / 2**20:.1f} MiB")
        assert threads1 <= threads0 + 2
        assert rss1 - rss0 < 48 * 2**20  # settles near the warm baseline (no per-stream leak)
        assert metric(stack, "speedgate_replica_inflight") == 0
    finally:
        stack.stop()
