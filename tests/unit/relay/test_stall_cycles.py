"""A stream and an assembled answer cut by the stall limit (``MovingDeadline``) leave no
reference cycle, and the stream's in-band error says stall (uvloop, the gateway's loop). The
engine holds each stream after its first event: every request is cut, whatever the timing."""

from __future__ import annotations

import asyncio
import gc
from collections import Counter

import uvloop

from loadtests.raw_engine import Answers
from tests.unit.telemetry.test_gcstats import Call, chat, cycles_found_by_collection, gateway


async def _stalls() -> None:
    timeouts = {"stall_s": 0.05, "ttft_s": 5, "total_s": 30}
    async with gateway(Answers("served", 20), timeouts) as app:
        def calls() -> list[Call]:
            return [Call(chat(True, user="hold")), Call(chat(False, user="hold"))]

        for _ in range(2):
            await asyncio.gather(*(c.run(app) for c in calls()))
        gc.collect()
        gc.disable()
        try:
            statuses: Counter[int] = Counter()
            last: list[Call] = []
            for _ in range(10):
                last = calls()
                statuses.update(await asyncio.gather(*(c.run(app) for c in last)))
            for _ in range(5):
                await asyncio.sleep(0)
            found = cycles_found_by_collection()
        finally:
            gc.enable()
    body = b"".join(m.get("body", b"") for m in last[0].sent if m["type"] == "http.response.body")
    assert b"stall" in body, body
    kinds = Counter(type(o).__qualname__ for o in found)
    assert not found, f"{len(found)} objects in reference cycles: {kinds.most_common(12)}"
    assert statuses[200] == 10, statuses


def test_stall_timeouts_leave_no_reference_cycle() -> None:
    """20 stall cuts with the collector off; nothing a collection would free."""
    uvloop.run(_stalls())
