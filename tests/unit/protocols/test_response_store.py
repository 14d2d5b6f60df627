"""The Responses state store: in memory (LRU, TTL renewed by use, size limit) and in Redis
(shared, TTL renewed by every read of a chain, Redis down is ``StoreUnavailable``, never a
missing record)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis.asyncio as aioredis

from gateway.admit.auth import KeyRing, hash_key
from gateway.config import ApiKeyConfig, AuthConfig
from gateway.protocols.responses.store import (
    MemoryResponseStore,
    RedisResponseStore,
    StoreUnavailable,
)

REDIS_URL = "redis://127.0.0.1:6379/0"


def rec(rid: str, size: int = 10) -> dict:
    return {"id": rid, "key": "", "items": ["x" * size], "output": [], "chain": []}


def test_memory_store_ttl_renewed_by_use_lru_and_size_limit():
    async def main():
        now = [0.0]
        s = MemoryResponseStore(ttl_s=10, max_record_bytes=200, max_entries=2,
                                clock=lambda: now[0])
        assert await s.put(rec("a")) and await s.put(rec("b"))
        now[0] = 8.0
        assert (await s.get("a"))["id"] == "a"  # read at 8 s: alive until 18 s
        now[0] = 15.0
        assert await s.get("b") is None  # written at 0 s, never read: expired at 10 s
        assert await s.get("a") is not None
        await s.put(rec("c"))
        await s.put(rec("d"))  # over 2 entries: the least recently used (a) goes
        assert [r and r["id"] for r in await s.get_many(["a", "c", "d"])] == [None, "c", "d"]
        assert not await s.put(rec("big", size=500)) and s.skipped_too_large == 1
        assert await s.get("big") is None
        assert await s.delete("c") and not await s.delete("c")

    asyncio.run(main())


def test_memory_store_expires_by_time_without_any_read():
    """Records go when their TTL passes even if nothing reads the store again (the timer)."""
    async def main():
        s = MemoryResponseStore(ttl_s=0.05, max_record_bytes=1 << 20, max_entries=100)
        for i in range(5):
            assert await s.put(rec(f"r{i}", size=10_000))
        assert s.bytes > 50_000
        await asyncio.sleep(0.3)  # no call into the store meanwhile
        assert s.bytes == 0 and not s._data
        await s.close()

    asyncio.run(main())


def test_memory_store_bounded_by_total_bytes_least_recent_first():
    async def main():
        now = [0.0]
        s = MemoryResponseStore(ttl_s=100, max_record_bytes=1 << 20, max_entries=100,
                                max_bytes=3 * 1100, clock=lambda: now[0])
        for rid in ("a", "b", "c"):
            assert await s.put(rec(rid, size=1000))
        assert await s.get("a") is not None  # a is now the most recent
        assert await s.put(rec("d", size=1000))  # over the bytes: b (least recent) goes
        assert [r and r["id"] for r in await s.get_many(["a", "b", "c", "d"])] == [
            "a", None, "c", "d"]
        assert s.bytes <= s.max_bytes and s.evicted == 1
        assert not await s.put(rec("huge", size=4000))  # larger than the whole bound
        assert s.bytes <= s.max_bytes
        await s.close()

    asyncio.run(main())


@pytest.fixture
def prefix():
    p = f"speedgate-test:resp:{uuid.uuid4().hex}:"
    yield p

    async def cleanup():
        client = aioredis.Redis.from_url(REDIS_URL)
        keys = [k async for k in client.scan_iter(match=p + "*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()

    asyncio.run(cleanup())


def test_redis_store_shared_and_ttl_renewed_by_reads(prefix):
    async def main():
        a = RedisResponseStore.from_url(REDIS_URL, timeout_s=1, prefix=prefix, ttl_s=30,
                                        max_record_bytes=1 << 20)
        b = RedisResponseStore.from_url(REDIS_URL, timeout_s=1, prefix=prefix, ttl_s=30,
                                        max_record_bytes=1 << 20)
        await a.put(rec("r1"))
        await a.client.pexpire(prefix + "rec:r1", 1000)  # as if it had aged
        got = await b.get_many(["r1", "missing"])  # another gateway reads it
        assert got[0]["id"] == "r1" and got[1] is None
        assert await a.client.pttl(prefix + "rec:r1") > 20_000  # the read renewed the TTL
        assert await b.delete("r1") and await a.get("r1") is None
        await a.close()
        await b.close()

    asyncio.run(main())


def test_redis_down_is_unavailable_not_missing(prefix):
    async def main():
        s = RedisResponseStore.from_url("redis://127.0.0.1:1/0", timeout_s=0.1, prefix=prefix,
                                        ttl_s=30, max_record_bytes=1 << 20)
        for _ in range(5):
            with pytest.raises(StoreUnavailable):
                await s.get("r1")
        assert s.breaker.is_open  # later calls skip Redis at once
        with pytest.raises(StoreUnavailable):
            await s.put(rec("r1"))
        await s.close()

    asyncio.run(main())


def test_keyring_accepts_x_api_key_and_prefers_bearer():
    key = "sg-" + "k" * 43
    ring = KeyRing(AuthConfig(keys=[ApiKeyConfig(id="a", hash=hash_key(key))]))
    assert ring.authenticate(None, key).id == "a"  # Anthropic SDKs: x-api-key
    assert ring.authenticate(f"Bearer {key}", "wrong").id == "a"
    with pytest.raises(Exception) as e:
        ring.authenticate(None, "  ")
    assert getattr(e.value, "code", None) == "missing_api_key"
