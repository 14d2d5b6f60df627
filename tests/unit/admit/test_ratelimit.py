"""Rate limits: token-bucket arithmetic (memory) and the atomic Lua script (Redis)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import pytest

from gateway.admit.ratelimit import (
    LimiterUnavailable,
    MemoryLimiter,
    RateLimited,
    format_duration,
)
from gateway.admit.ratelimit_redis import RedisLimiter
from gateway.config import KeyLimits

REDIS_URL = "redis://127.0.0.1:6379/0"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_format_duration_like_openai():
    assert format_duration(0.25) == "250ms"
    assert format_duration(1.0) == "1s"
    assert format_duration(1.5) == "1.5s"
    assert format_duration(360) == "6m0s"


async def test_memory_token_bucket_reserve_refill_and_correct():
    clock = Clock()
    lim = MemoryLimiter(clock=clock)
    limits = KeyLimits(tokens_per_min=1000)
    d, r1 = await lim.reserve("k", limits, 400)
    assert r1 is not None and d.tokens_level == 600
    d, r2 = await lim.reserve("k", limits, 400)
    assert r2 is not None and d.tokens_level == 200
    d, r3 = await lim.reserve("k", limits, 400)
    assert r3 is None and d.exceeded == "tokens"
    assert d.retry_after_s == pytest.approx(12.0)  # 200 missing at 1000/60 per second
    headers = dict(d.headers())
    assert headers[b"x-ratelimit-limit-tokens"] == b"1000"
    assert headers[b"x-ratelimit-remaining-tokens"] == b"200"
    assert headers[b"x-ratelimit-reset-tokens"] == b"48s"
    await lim.release(r1, 100)  # used 100 of 400: 300 back
    _, r4 = await lim.reserve("k", limits, 400)
    assert r4 is not None
    clock.t += 60  # a minute refills the bucket completely
    d, _ = await lim.reserve("k", limits, 1)
    assert d.tokens_level == 999


async def test_memory_too_large_request_and_rpm_and_concurrency():
    lim = MemoryLimiter(clock=Clock())
    d, r = await lim.reserve("k", KeyLimits(tokens_per_min=100), 101)
    assert r is None and d.exceeded == "tokens"
    assert "Request too large" in RateLimited("k", d).message
    rpm = KeyLimits(requests_per_min=2)
    assert (await lim.reserve("r", rpm, 0))[1] is not None
    assert (await lim.reserve("r", rpm, 0))[1] is not None
    d, r = await lim.reserve("r", rpm, 0)
    assert r is None and d.exceeded == "requests"
    err = RateLimited("r", d)
    assert err.status == 429 and err.code == "rate_limit_exceeded"
    assert err.headers()["retry-after"] == "30" and "x-ratelimit-limit-requests" in err.headers()
    conc = KeyLimits(concurrent=2)
    a = (await lim.reserve("c", conc, 0))[1]
    b = (await lim.reserve("c", conc, 0))[1]
    assert (await lim.reserve("c", conc, 0))[1] is None
    assert a is not None and b is not None
    await lim.release(a, 0)
    await lim.release(a, 0)  # twice is harmless
    assert lim.inflight("c") == 1
    await lim.release(b, 0)
    assert lim.inflight("c") == 0


@contextlib.asynccontextmanager
async def redis_limiter():
    """A limiter on the shared Redis under a unique prefix, its keys deleted afterwards."""
    redis = pytest.importorskip("redis.asyncio")
    client = redis.Redis.from_url(REDIS_URL, socket_timeout=1, socket_connect_timeout=1)
    try:
        await client.ping()
    except Exception:
        await client.aclose()
        pytest.skip("no Redis on 127.0.0.1:6379")
    prefix = f"test:rl:{uuid.uuid4().hex}:"
    lim = RedisLimiter(client, prefix=prefix, slot_ttl_s=30)
    try:
        yield lim
    finally:
        keys = [k async for k in client.scan_iter(match=prefix + "*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()


async def test_redis_check_and_reserve_is_atomic_under_concurrency():
    async with redis_limiter() as lim:
        await _atomic(lim)


async def _atomic(redis_limiter: RedisLimiter) -> None:
    limits = KeyLimits(tokens_per_min=1000, requests_per_min=100, concurrent=50)
    results = await asyncio.gather(*(redis_limiter.reserve("k", limits, 300) for _ in range(20)))
    admitted = [r for _, r in results if r is not None]
    assert len(admitted) == 3  # 3 × 300 ≤ 1000 < 4 × 300, whatever the interleaving
    denied = next(d for d, r in results if r is None)
    assert denied.exceeded == "tokens" and 0 < denied.retry_after_s <= 60
    assert await redis_limiter.inflight("k") == 3
    for r in admitted:
        await redis_limiter.release(r, 0)  # nothing used: all back
    assert await redis_limiter.inflight("k") == 0
    d, r = await redis_limiter.reserve("k", limits, 900)
    assert r is not None and d.tokens_level == pytest.approx(100, abs=2)


async def test_redis_concurrency_slots():
    async with redis_limiter() as lim:
        await _slots(lim)


async def _slots(redis_limiter: RedisLimiter) -> None:
    limits = KeyLimits(concurrent=2)
    a = (await redis_limiter.reserve("c", limits, 0))[1]
    b = (await redis_limiter.reserve("c", limits, 0))[1]
    d, c = await redis_limiter.reserve("c", limits, 0)
    assert c is None and d.exceeded == "concurrent"
    await redis_limiter.release(a, 0)
    assert (await redis_limiter.reserve("c", limits, 0))[1] is not None
    await redis_limiter.release(b, 0)


class _DeadScript:
    async def __call__(self, **kw):
        raise ConnectionError("redis down")


class _DeadClient:
    def register_script(self, src):
        return _DeadScript()

    async def aclose(self):
        return None


async def test_redis_down_fail_open_limits_locally_and_fail_closed_refuses():
    limits = KeyLimits(requests_per_min=1)
    lim = RedisLimiter(_DeadClient(), fail_mode="open")
    assert (await lim.reserve("k", limits, 0))[1] is not None
    assert (await lim.reserve("k", limits, 0))[1] is None  # still limited, on local state
    closed = RedisLimiter(_DeadClient(), fail_mode="closed")
    with pytest.raises(LimiterUnavailable) as e:
        await closed.reserve("k", limits, 0)
    assert e.value.status == 503 and e.value.headers()["retry-after"] == "1"
