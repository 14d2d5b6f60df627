"""The simulator's ``--scheduling-policy`` (vLLM's): ``priority`` orders the waiting queue by
the request's ``priority`` field (lower first, then arrival); ``fcfs`` keeps arrival order and
refuses a non-zero ``priority`` with vLLM's 400."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from engines.sim.engine import Engine, Job
from engines.sim.kvcache import PrefixCache
from engines.sim.metrics import SimMetrics
from engines.sim.perf import PerfModel
from engines.sim.testing import start_sim


async def _finish_order(policy: str) -> list[str]:
    engine = Engine(PerfModel(), PrefixCache(1000, 16), SimMetrics("m", False),
                    max_num_seqs=1, time_scale=0, scheduling_policy=policy)  # type: ignore[arg-type]
    engine.start()
    try:
        jobs: dict[str, Job] = {}

        def submit(name: str, priority: int) -> None:
            job = Job(priority)
            job.add(0, 16, [], 20)
            jobs[name] = job
            engine.submit(job)

        submit("running", 0)
        first = await jobs["running"].next()  # its first token: it holds the only slot
        assert not any(done for _, _, done in first)
        submit("batch", 2)
        submit("standard", 1)
        submit("interactive", 0)
        assert engine.num_waiting == 3
        order: list[str] = []

        async def wait(name: str) -> None:
            while True:
                if any(done for _, _, done in await jobs[name].next()):
                    order.append(name)
                    return

        await asyncio.wait_for(asyncio.gather(*(wait(n) for n in jobs)), 10)
        return order
    finally:
        await engine.stop()


async def test_priority_policy_admits_lower_priority_values_first():
    assert await _finish_order("priority") == ["running", "interactive", "standard", "batch"]


async def test_fcfs_policy_keeps_arrival_order():
    assert await _finish_order("fcfs") == ["running", "batch", "standard", "interactive"]


@pytest.mark.e2e
def test_priority_field_is_checked_like_vllm():
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with start_sim(time_scale=0, model="m") as fcfs:
        assert httpx.post(fcfs.url + "/v1/chat/completions", json=body).status_code == 200
        ok0 = httpx.post(fcfs.url + "/v1/chat/completions", json={**body, "priority": 0})
        assert ok0.status_code == 200
        r = httpx.post(fcfs.url + "/v1/chat/completions", json={**body, "priority": 2})
        assert r.status_code == 400
        assert "Priority scheduling is not enabled" in r.json()["error"]["message"]
    with start_sim(time_scale=0, model="m", scheduling_policy="priority") as prio:
        r = httpx.post(prio.url + "/v1/chat/completions", json={**body, "priority": 2})
        assert r.status_code == 200
        bad = httpx.post(prio.url + "/v1/chat/completions", json={**body, "priority": "high"})
        assert bad.status_code == 400
