"""Per-key and per-session usage totals: in-memory and Redis (two stores = two gateways)."""

import asyncio
import uuid

import pytest
import redis.asyncio as aioredis

from gateway.common.usage import Usage
from gateway.telemetry.record import RequestRecord
from gateway.telemetry.usage_store import (
    MemoryUsageStore,
    RedisUsageStore,
    UsageDelta,
    UsageStoreUnavailable,
    UsageTotals,
)

REDIS_URL = "redis://127.0.0.1:6379/0"

D1 = UsageDelta(input_tokens=2006, cached_input_tokens=1920, output_tokens=300,
                cost_usd=0.000878, ttft_s=0.25, e2e_s=2.0)
D2 = UsageDelta(input_tokens=100, output_tokens=10, cost_usd=0.0001, ttft_s=None, e2e_s=0.5,
                error=True, estimated=True)


def _check(t: UsageTotals, n: int = 1) -> None:
    assert t.requests == 2 * n and t.errors == n and t.estimated_requests == n
    assert t.input_tokens == 2106 * n and t.cached_input_tokens == 1920 * n
    assert t.output_tokens == 310 * n
    assert t.cost_usd == pytest.approx(0.000978 * n, abs=1e-12)
    assert t.ttft_s_sum == pytest.approx(0.25 * n) and t.ttft_count == n
    assert t.e2e_s_sum == pytest.approx(2.5 * n)
    assert 0 < t.first_seen <= t.last_seen
    d = t.to_dict()
    assert d["ttft_s_mean"] == pytest.approx(0.25) and d["e2e_s_mean"] == pytest.approx(1.25)


def test_delta_from_record():
    rec = RequestRecord(request_id="r", path="/v1/chat/completions", stream=True)
    rec.usage, rec.cost_usd, rec.outcome = Usage(10, 5, 2), 0.01, "ok"
    rec.ttft_s, rec.e2e_s = 0.1, 1.0
    d = UsageDelta.from_record(rec)
    assert (d.input_tokens, d.cached_input_tokens, d.output_tokens) == (10, 2, 5)
    assert d.ttft_s == 0.1 and not d.error and not d.estimated
    rec.stream, rec.outcome, rec.usage = False, "timeout", None
    d = UsageDelta.from_record(rec)
    assert d.ttft_s is None and d.error and d.input_tokens == 0


def test_memory_store_totals_and_session_bound():
    async def main():
        s = MemoryUsageStore(max_sessions=2)
        await s.add("key-a", "s1", D1)
        await s.add("key-a", "s1", D2)
        await s.add(None, "s2", D1)
        await s.add("key-b", None, D2)
        _check(await s.get_key("key-a"))
        _check(await s.get_session("key-a", "s1"))
        assert (await s.get_key("key-b")).requests == 1
        assert (await s.get_key("nobody")).requests == 0
        await s.add(None, "s3", D1)  # over max_sessions: the least recently used (s1) goes
        assert (await s.get_session("key-a", "s1")).requests == 0
        assert (await s.get_session(None, "s3")).requests == 1
        long_id = "x" * 1000
        await s.add(long_id, long_id, D1)
        assert (await s.get_session(long_id, long_id)).requests == 1
        await s.close()

    asyncio.run(main())


@pytest.fixture
def prefix():
    """A unique key prefix per test; every key under it is deleted afterwards."""
    p = f"speedgate-test:{uuid.uuid4().hex}:"
    yield p

    async def cleanup():
        client = aioredis.Redis.from_url(REDIS_URL)
        keys = [k async for k in client.scan_iter(match=p + "*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()

    asyncio.run(cleanup())


def test_redis_totals_shared_by_two_gateways(prefix):
    async def main():
        a = RedisUsageStore.from_url(REDIS_URL, prefix=prefix, session_ttl_s=60)
        b = RedisUsageStore.from_url(REDIS_URL, prefix=prefix, session_ttl_s=60)
        await a.add("key-a", "sess-1", D1)
        await b.add("key-a", "sess-1", D2)
        await asyncio.gather(a.add("key-a", "sess-1", D1), b.add("key-a", "sess-1", D2))
        for store in (a, b):
            _check(await store.get_key("key-a"), n=2)
            _check(await store.get_session("key-a", "sess-1"), n=2)
        assert (await a.get_session("key-a", "other")).requests == 0
        assert (await a.get_session("key-b", "sess-1")).requests == 0  # scoped by key
        ttl = await a.client.ttl(a.session_hash("key-a", "sess-1"))
        assert 0 < ttl <= 60
        assert await a.client.ttl(a.key_hash("key-a")) == -1  # keys do not expire
        assert a.dropped == b.dropped == 0
        await a.close()
        await b.close()

    asyncio.run(main())


def test_redis_down_never_fails_add_and_breaker_opens(prefix):
    async def main():
        # nothing listens on port 1: connection refused at once
        s = RedisUsageStore.from_url("redis://127.0.0.1:1/0", prefix=prefix, timeout_s=0.1,
                                     breaker_failures=2, breaker_cooldown_s=60)
        for _ in range(5):
            await s.add("k", "s", D1)  # never raises
        assert s.dropped == 5 and s.breaker.skipped == 3  # the breaker skipped the last three
        with pytest.raises(UsageStoreUnavailable):
            await s.get_key("k")
        await s.close()

    asyncio.run(main())
