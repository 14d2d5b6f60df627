"""The shared active-session ledger (``ledger_redis``) on the real Redis: two gateways' ledgers
count the same sessions; sessions move between replicas, idle out, and the one being bound is
left out; with Redis unreachable each falls back to its own process's counts."""

from __future__ import annotations

import asyncio
import socket
import uuid

import pytest

from gateway.common.breaker import CircuitBreaker
from gateway.routing.session_ledger import SessionLedger
from gateway.routing.session_ledger_redis import RedisSessionLedger

REPLICAS = ["m/s/0", "m/s/1", "m/s/2"]


def _ledger(client, prefix: str, idle_s: float = 60.0) -> RedisSessionLedger:
    return RedisSessionLedger(client, CircuitBreaker("t"), SessionLedger(idle_s), pool="m/s",
                              prefix=prefix, timeout_s=1.0)


async def test_two_gateways_count_the_same_sessions():
    aioredis = pytest.importorskip("redis.asyncio")
    client = aioredis.Redis.from_url("redis://127.0.0.1:6379/0", socket_timeout=1)
    prefix = f"test:ledger:{uuid.uuid4().hex[:8]}:"
    try:
        a, b = _ledger(client, prefix), _ledger(client, prefix, idle_s=0.5)
        a.touch("s1", "m/s/0", 0.0, REPLICAS)
        a.touch("s2", "m/s/0", 0.0, REPLICAS)
        b.touch("s3", "m/s/1", 0.0, REPLICAS)
        await asyncio.gather(a.drain(), b.drain())
        assert await b.counts(0.0, "", REPLICAS) == {"m/s/0": 2, "m/s/1": 1, "m/s/2": 0}
        assert await a.counts(0.0, "s2", REPLICAS) == {"m/s/0": 1, "m/s/1": 1, "m/s/2": 0}
        b.touch("s1", "m/s/2", 0.0, REPLICAS)  # s1's next turn, rebound by the other gateway
        await b.drain()
        assert await a.counts(0.0, "", REPLICAS) == {"m/s/0": 1, "m/s/1": 1, "m/s/2": 1}
        assert a.local.counts(0.0) == {"m/s/0": 2}  # what gateway A alone has seen
        await asyncio.sleep(0.6)  # b's window is 0.5 s: every session is idle for it
        assert await b.counts(0.0, "", REPLICAS) == {"m/s/0": 0, "m/s/1": 0, "m/s/2": 0}
    finally:
        keys = [k async for k in client.scan_iter(match=prefix + "*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()


async def test_redis_down_falls_back_to_this_process_counts():
    aioredis = pytest.importorskip("redis.asyncio")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: connection refused
    client = aioredis.Redis.from_url(f"redis://127.0.0.1:{port}/0", socket_timeout=0.2,
                                     socket_connect_timeout=0.2)
    try:
        led = _ledger(client, "x:")
        led.touch("s1", "m/s/1", 0.0, REPLICAS)
        await led.drain()
        assert await led.counts(0.0, "", REPLICAS) == {"m/s/1": 1}
        assert led.breaker._failures == 2
    finally:
        await client.aclose()
