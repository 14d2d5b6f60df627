"""A subagent's usage rolls up to its parent session: the store keeps the parent → children
links (in memory and in Redis) and ``session_tree`` sums each session with its descendants."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis.asyncio as aioredis

from gateway.telemetry.usage_store import (
    MemoryUsageStore,
    RedisUsageStore,
    UsageDelta,
    UsageTotals,
)
from gateway.telemetry.usage_tree import session_tree

REDIS_URL = "redis://127.0.0.1:6379/0"

MAIN = UsageDelta(input_tokens=1000, cached_input_tokens=800, output_tokens=50,
                  cost_usd=0.004, ttft_s=0.2, e2e_s=1.0)
SUB = UsageDelta(input_tokens=300, output_tokens=20, cost_usd=0.001, ttft_s=0.1, e2e_s=0.5)
SUBSUB = UsageDelta(input_tokens=40, output_tokens=4, cost_usd=0.0002, e2e_s=0.25, error=True)


def test_merged_sums_and_keeps_the_span() -> None:
    a, b = UsageTotals(), UsageTotals()
    a.add(MAIN, 100.0)
    b.add(SUB, 90.0)
    b.add(SUB, 120.0)
    m = a.merged(b)
    assert (m.requests, m.input_tokens, m.cached_input_tokens, m.output_tokens) == (
        3, 1600, 800, 90)
    assert m.cost_usd == pytest.approx(0.006) and m.ttft_count == 3
    assert m.ttft_s_sum == pytest.approx(0.4) and m.e2e_s_sum == pytest.approx(2.0)
    assert (m.first_seen, m.last_seen) == (90.0, 120.0)
    assert UsageTotals().merged(a).first_seen == 100.0  # 0 is "none", not the earliest


async def _fill(store) -> None:
    await store.add("k", "main", MAIN)
    await store.add("k", "main", MAIN)
    await store.add("k", "main/agent/a1", SUB, parent="main")
    await store.add("k", "main/agent/a2", SUB, parent="main")
    await store.add("k", "main/agent/a2", SUB, parent="main")
    await store.add("k", "main/agent/a3", SUBSUB, parent="main/agent/a2")
    await store.add("other-key", "main", MAIN)  # another key's session of that id: apart


def _check(tree: dict) -> None:
    assert tree["session_id"] == "main" and tree["own"]["requests"] == 2
    # rolled up: 2 main + 1 a1 + 2 a2 + 1 a3
    assert tree["requests"] == 6 and tree["errors"] == 1
    assert tree["input_tokens"] == 2000 + 300 * 3 + 40
    assert tree["output_tokens"] == 100 + 20 * 3 + 4
    assert tree["cost_usd"] == pytest.approx(0.008 + 0.003 + 0.0002)
    kids = {c["session_id"]: c for c in tree["children"]}
    assert set(kids) == {"main/agent/a1", "main/agent/a2"}
    a2 = kids["main/agent/a2"]
    assert a2["own"]["requests"] == 2 and a2["requests"] == 3
    assert a2["cost_usd"] == pytest.approx(0.0022)
    assert [c["session_id"] for c in a2["children"]] == ["main/agent/a3"]
    assert kids["main/agent/a1"]["children"] == [] and tree["ended"] is None


def test_memory_tree_rolls_up() -> None:
    async def main() -> None:
        s = MemoryUsageStore()
        await _fill(s)
        _check(await session_tree(s, "k", "main"))
        assert (await session_tree(s, "other-key", "main"))["requests"] == 1
        assert await session_tree(s, "k", "nobody") is None
        assert await session_tree(s, "nobody", "main/agent/a1") is None
        await s.end("k", "main", "explicit")
        assert (await session_tree(s, "k", "main"))["ended"] == "explicit"
        await s.add("k", "main", MAIN)  # a turn after the end: it goes on
        assert (await session_tree(s, "k", "main"))["ended"] is None

    asyncio.run(main())


def test_links_are_bounded_like_the_sessions() -> None:
    """A client naming a new parent on every request (never a session itself) cannot grow the
    links past ``max_sessions`` parents; a parent keeps at most ``MAX_CHILDREN`` children."""
    from gateway.telemetry.usage_store import MAX_CHILDREN

    async def main() -> None:
        s = MemoryUsageStore(max_sessions=10)
        for i in range(100):
            await s.add("k", f"child-{i}", SUB, parent=f"parent-{i}")
        assert len(s._children) == 10 and len(s._sessions) == 10
        for i in range(MAX_CHILDREN + 5):
            await s.add("k", f"c{i}", SUB, parent="busy")
        assert len(await s.children("k", "busy")) == MAX_CHILDREN

    asyncio.run(main())


def test_a_cycle_is_cut() -> None:
    async def main() -> None:
        s = MemoryUsageStore()
        await s.add("k", "a", MAIN, parent="b")
        await s.add("k", "b", SUB, parent="a")
        tree = await session_tree(s, "k", "a")
        assert tree["requests"] == 2 and tree["children"][0]["children"] == []

    asyncio.run(main())


@pytest.fixture
def prefix():
    """A unique key prefix per test; every key under it is deleted afterwards."""
    p = f"speedgate-test:{uuid.uuid4().hex}:"
    yield p

    async def cleanup() -> None:
        client = aioredis.Redis.from_url(REDIS_URL)
        keys = [k async for k in client.scan_iter(match=p + "*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()

    asyncio.run(cleanup())


def test_redis_tree_rolls_up_across_gateways(prefix: str) -> None:
    async def main() -> None:
        a = RedisUsageStore.from_url(REDIS_URL, prefix=prefix, session_ttl_s=60)
        b = RedisUsageStore.from_url(REDIS_URL, prefix=prefix, session_ttl_s=60)
        await _fill(a)
        _check(await session_tree(b, "k", "main"))  # what one gateway wrote, the other reads
        assert 0 < await a.client.ttl(a.children_key("k", "main")) <= 60
        await b.end("k", "main", "idle")
        assert (await session_tree(a, "k", "main"))["ended"] == "idle"
        await a.end("k", "never-seen", "explicit")  # no totals: nothing written
        assert not await a.client.exists(a.session_hash("k", "never-seen"))
        await a.close()
        await b.close()

    asyncio.run(main())
