"""Session bindings recorded by the in-process store (inline, ``record_nowait``) and by the
Redis store (in a task): 12 sessions stay on their replicas over later turns either way."""

from __future__ import annotations

import asyncio
import random
import uuid

import pytest

from gateway.common.breaker import CircuitBreaker
from gateway.routing import RouteRequest
from gateway.routing.pipeline import PoolRouter
from gateway.routing.store import MemoryRoutingStore, RedisRoutingStore
from tests.unit.routing.test_routing_pipeline import _doc, _pool


async def _sessions_stay(router: PoolRouter, pool) -> None:
    homes = {}
    for s in range(12):
        got = await router.pick(RouteRequest.from_doc(_doc(2, f"t{s}"), f"s{s}"), pool.replicas)
        homes[s] = got.name
    await router.drain()
    for turn in range(3, 6):
        for s in range(12):
            got = await router.pick(
                RouteRequest.from_doc(_doc(turn, f"t{s}"), f"s{s}"), pool.replicas)
            assert got.name == homes[s], (s, turn)
        await router.drain()


def test_memory_store_sessions_stay_on_their_replica():
    """In-process: bound at once."""
    async def run():
        pool = _pool(4)
        await _sessions_stay(PoolRouter(pool, MemoryRoutingStore(), random.Random(0)), pool)

    asyncio.run(run())


def test_redis_store_records_in_a_task_and_sessions_stay():
    """Redis (127.0.0.1:6379; skipped without it): recorded in a task, written once drained."""
    pytest.importorskip("redis.asyncio")

    async def run():
        breaker = CircuitBreaker("routing", failures=3, cooldown_s=5)
        store = RedisRoutingStore.from_url("redis://127.0.0.1:6379", breaker, timeout_s=0.5,
                                           prefix=f"review:{uuid.uuid4().hex}:")
        if not await store.ping():
            pytest.skip("no redis")
        pool = _pool(4)
        store.configure(pool.key, 1000, 60)
        router = PoolRouter(pool, store, random.Random(0))
        try:
            route = RouteRequest.from_doc(_doc(2), "sx")
            first = await router.pick(route, pool.replicas)
            assert router._pending  # a shared store records in a task
            await router.drain()
            key = store.session_key(pool.key, route.session_key)
            assert await store.client.get(key) == first.name.encode()
            await _sessions_stay(router, pool)
        finally:
            keys = [k async for k in store.client.scan_iter(match=store.prefix + "*")]
            if keys:
                await store.client.delete(*keys)
            await store.close()

    asyncio.run(run())
