"""``RedisLimiter``: the per-key rate limits shared by every gateway replica, enforced by one
Lua script on Redis' clock (see ``gateway.admit.ratelimit`` for the bucket arithmetic and the
``Limiter`` interface this implements). Times in seconds unless a name says ``_ms``."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from gateway.admit.ratelimit import (
    LimitDecision,
    LimiterUnavailable,
    MemoryLimiter,
    Reservation,
)
from gateway.common.breaker import CircuitBreaker
from gateway.config import KeyLimits

# KEYS: 1 requests bucket, 2 tokens bucket, 3 concurrency leases (zset: lease -> expiry ms)
# ARGV: 1 rpm, 2 tpm, 3 concurrent (0 = none), 4 tokens needed, 5 lease id, 6 lease ttl ms
RESERVE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function level(key, cap)
  local v = redis.call('HMGET', key, 'l', 't')
  local l, ts = tonumber(v[1]), tonumber(v[2])
  if l == nil then return cap end
  return math.min(cap, l + (now - ts) * cap / 60000)
end
local function store(key, cap, lv)
  redis.call('HSET', key, 'l', tostring(lv), 't', now)
  redis.call('PEXPIRE', key, math.ceil((cap - lv) * 60000 / cap) + 60000)
end
local rcap, tcap, ccap = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local need = tonumber(ARGV[4])
local rl, tl = -1, -1
local exceeded, wait = '', 0
if rcap > 0 then
  rl = level(KEYS[1], rcap)
  if rl < 1 then exceeded, wait = 'requests', (1 - rl) * 60000 / rcap end
end
if tcap > 0 then
  tl = level(KEYS[2], tcap)
  if tl < need then
    local w = 60000
    if need <= tcap then w = (need - tl) * 60000 / tcap end
    if exceeded == '' or w > wait then exceeded, wait = 'tokens', w end
  end
end
local inflight = 0
if ccap > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  inflight = redis.call('ZCARD', KEYS[3])
  if exceeded == '' and inflight >= ccap then exceeded, wait = 'concurrent', 1000 end
end
if exceeded == '' then
  if rcap > 0 then rl = rl - 1; store(KEYS[1], rcap, rl) end
  if tcap > 0 then tl = tl - need; store(KEYS[2], tcap, tl) end
  if ccap > 0 then
    local ttl = tonumber(ARGV[6])
    redis.call('ZADD', KEYS[3], now + ttl, ARGV[5])
    redis.call('PEXPIRE', KEYS[3], ttl)
    inflight = inflight + 1
  end
end
return {exceeded, tostring(rl), tostring(tl), tostring(wait), inflight}
"""

# KEYS: 1 tokens bucket, 2 concurrency leases. ARGV: 1 tpm, 2 tokens to give back (may be < 0),
# 3 lease id ('' = none)
RELEASE_LUA = """
if ARGV[3] ~= '' then redis.call('ZREM', KEYS[2], ARGV[3]) end
local cap, delta = tonumber(ARGV[1]), tonumber(ARGV[2])
if cap > 0 and delta ~= 0 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local v = redis.call('HMGET', KEYS[1], 'l', 't')
  local l, ts = tonumber(v[1]), tonumber(v[2])
  local lv = cap
  if l ~= nil then lv = math.min(cap, l + (now - ts) * cap / 60000) end
  lv = math.min(cap, lv + delta)
  redis.call('HSET', KEYS[1], 'l', tostring(lv), 't', now)
  redis.call('PEXPIRE', KEYS[1], math.ceil((cap - lv) * 60000 / cap) + 60000)
end
return 1
"""


class RedisLimiter:
    """The limits in Redis, shared by all gateway replicas. ``client``: a
    ``redis.asyncio.Redis`` with short timeouts and ``breaker`` its circuit breaker (both from
    the gateway's shared ``RedisConnection``); ``fallback``: the limiter used while Redis
    cannot answer under ``fail_mode`` ``open``. ``close`` closes the client only when
    ``owns_client``."""

    def __init__(
        self,
        client: Any,
        *,
        prefix: str = "speedgate:rl:",
        slot_ttl_s: float = 3600.0,
        fail_mode: str = "open",
        breaker: CircuitBreaker | None = None,
        fallback: MemoryLimiter | None = None,
        owns_client: bool = False,
    ) -> None:
        self.client = client
        self.owns_client = owns_client
        self.prefix = prefix
        self.slot_ttl_ms = int(slot_ttl_s * 1000)
        self.fail_mode = fail_mode
        self.breaker = breaker or CircuitBreaker("ratelimit")
        self.fallback = fallback or MemoryLimiter()
        self._reserve = client.register_script(RESERVE_LUA)
        self._release = client.register_script(RELEASE_LUA)
        self._pending: set[asyncio.Task[None]] = set()

    async def _forget_lease(self, slots_key: str, lease: str) -> None:
        """Remove ``lease`` from the concurrency set, retrying for a few seconds (Redis may be
        slow right now); errors are swallowed: the slot TTL is the last resort."""
        for delay in (0.2, 1.0, 3.0):
            await asyncio.sleep(delay)
            try:
                await self.client.zrem(slots_key, lease)
                return
            except Exception:
                continue

    def keys(self, key_id: str) -> list[str]:
        """Redis keys of ``key_id`` (one hash tag, so one cluster slot)."""
        base = f"{self.prefix}{{{key_id}}}"
        return [base + ":rpm", base + ":tpm", base + ":slots"]

    async def reserve(
        self, key_id: str, limits: KeyLimits, tokens: int
    ) -> tuple[LimitDecision, Reservation | None]:
        if self.breaker.allow():
            lease = uuid.uuid4().hex
            args = [limits.requests_per_min, limits.tokens_per_min, limits.concurrent, tokens,
                    lease, self.slot_ttl_ms]
            try:
                res = await self._reserve(keys=self.keys(key_id), args=args)
            except Exception as e:  # timeouts, connection errors, script errors
                self.breaker.failure(e)
                # the script may have run and taken a slot while its reply was lost: give the
                # lease back in the background (best effort), or it would hold until its TTL
                task = asyncio.get_running_loop().create_task(
                    self._forget_lease(self.keys(key_id)[2], lease)
                )
                self._pending.add(task)
                task.add_done_callback(self._pending.discard)
            else:
                self.breaker.success()
                return self._decision(key_id, limits, tokens, lease, res)
        if self.fail_mode == "closed":
            raise LimiterUnavailable("rate limiter unavailable; try again", retry_after_s=1)
        return await self.fallback.reserve(key_id, limits, tokens)

    def _decision(
        self, key_id: str, limits: KeyLimits, tokens: int, lease: str, res: list[Any]
    ) -> tuple[LimitDecision, Reservation | None]:
        exceeded = res[0].decode() if isinstance(res[0], bytes) else str(res[0])
        rl, tl, wait = (float(x) for x in res[1:4])
        d = LimitDecision(
            limits,
            exceeded=exceeded or None,
            requests_level=rl if limits.requests_per_min else None,
            tokens_level=tl if limits.tokens_per_min else None,
            inflight=int(res[4]),
            retry_after_s=wait / 1000,
            need_tokens=tokens,
        )
        if d.exceeded is not None:
            return d, None
        return d, Reservation(key_id, limits, tokens, lease if limits.concurrent else "", self)

    async def release(self, r: Reservation, actual_tokens: int) -> None:
        if r.released:
            return
        r.released = True
        delta = r.tokens - actual_tokens if r.limits.tokens_per_min else 0
        if not r.lease and not delta:
            return
        keys = self.keys(r.key_id)
        try:  # tried even with the breaker open: a lost release leaks a slot until its TTL
            await self._release(keys=[keys[1], keys[2]],
                                args=[r.limits.tokens_per_min, delta, r.lease])
        except Exception as e:
            self.breaker.failure(e)
        else:
            self.breaker.success()

    async def inflight(self, key_id: str) -> int:
        """Unexpired concurrency slots of ``key_id`` (for tests and diagnostics)."""
        key = self.keys(key_id)[2]
        t = await self.client.time()
        now_ms = int(t[0]) * 1000 + int(t[1]) // 1000
        return int(await self.client.zcount(key, now_ms, "+inf"))

    async def close(self) -> None:
        if self.owns_client:
            await self.client.aclose()
