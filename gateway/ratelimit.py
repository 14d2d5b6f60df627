"""Per-key rate limits: requests/min, tokens/min and concurrent requests (DESIGN §9-10).

Requests and tokens are token buckets: capacity = the per-minute limit, refilled continuously
at limit / 60 s, so a key can burst up to its limit and then sustains limit per minute (what
OpenAI's limits do; its ``x-ratelimit-reset-*`` is the time until the bucket is full again).
A request reserves 1 request and its estimated tokens (prompt counted with tiktoken plus
``max_tokens``/``max_completion_tokens`` when given) at admission, all-or-nothing; when it ends
the token reservation is corrected by ``actual - estimated`` (a refund, or a debt the bucket
pays back by refilling) and its concurrency slot is released.

Two backends behind one ``Limiter`` interface:

- ``MemoryLimiter``: this process only (no Redis).
- ``RedisLimiter``: shared by every gateway replica. One Lua script checks the three limits and
  reserves all of them atomically, on Redis' clock (``TIME``), so N replicas enforce one limit.
  Concurrency slots are a sorted set of lease ids scored by expiry (``rate_limits.slot_ttl_s``),
  so slots of a crashed gateway expire. Calls go through the shared ``CircuitBreaker``; when
  Redis cannot answer, ``fail_mode: open`` limits on this replica's memory and ``closed``
  answers 503.

Times in seconds unless a name says ``_ms``.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.breaker import CircuitBreaker
from gateway.config import KeyLimits
from gateway.errors import GatewayError

WINDOW_S = 60.0  # limits are per minute


@dataclass(slots=True)
class Decision:
    """The outcome of a check-and-reserve. ``exceeded``: ``requests`` | ``tokens`` |
    ``concurrent`` | None (admitted). Levels are what the buckets hold after the decision
    (None: no such limit); ``retry_after_s``: when the denied reservation could succeed."""

    limits: KeyLimits
    exceeded: str | None = None
    requests_level: float | None = None
    tokens_level: float | None = None
    inflight: int = 0
    retry_after_s: float = 0.0
    need_tokens: int = 0

    def headers(self) -> list[tuple[bytes, bytes]]:
        """OpenAI's rate-limit headers for the configured limits: ``x-ratelimit-limit-*``,
        ``x-ratelimit-remaining-*`` (whole units) and ``x-ratelimit-reset-*`` (time until the
        bucket is full, e.g. ``1s``, ``6m0s``, ``250ms``)."""
        out: list[tuple[bytes, bytes]] = []
        for name, cap, level in (
            ("requests", self.limits.requests_per_min, self.requests_level),
            ("tokens", self.limits.tokens_per_min, self.tokens_level),
        ):
            if cap <= 0 or level is None:
                continue
            reset_s = max(0.0, (cap - level) * WINDOW_S / cap)
            out += [
                (b"x-ratelimit-limit-" + name.encode(), str(cap).encode()),
                (b"x-ratelimit-remaining-" + name.encode(), str(max(0, int(level))).encode()),
                (b"x-ratelimit-reset-" + name.encode(), format_duration(reset_s).encode()),
            ]
        return out


def format_duration(seconds: float) -> str:
    """A duration the way OpenAI writes ``x-ratelimit-reset-*``: ``250ms``, ``1.5s``,
    ``6m0s``."""
    if seconds < 1:
        return f"{int(seconds * 1000)}ms"
    if seconds < 60:
        return f"{seconds:.3f}".rstrip("0").rstrip(".") + "s"
    minutes, rest = divmod(math.ceil(seconds), 60)
    return f"{minutes}m{rest}s"


class RateLimited(GatewayError):
    """429 with ``Retry-After`` and the ``x-ratelimit-*`` headers of the decision."""

    status = 429
    type = "requests"
    code = "rate_limit_exceeded"

    def __init__(self, key_id: str, d: Decision) -> None:
        lim = d.limits
        if d.exceeded == "tokens":
            if d.need_tokens > lim.tokens_per_min:
                what = (f"Request too large for tokens per min (TPM): Limit "
                        f"{lim.tokens_per_min}, Requested {d.need_tokens}.")
            else:
                what = (f"Rate limit reached for tokens per min (TPM): Limit "
                        f"{lim.tokens_per_min}, Requested {d.need_tokens}.")
        elif d.exceeded == "requests":
            what = f"Rate limit reached for requests per min (RPM): Limit {lim.requests_per_min}."
        else:
            what = f"Too many concurrent requests: Limit {lim.concurrent}."
        super().__init__(
            f"{what} API key id {key_id}. Please try again in "
            f"{format_duration(d.retry_after_s)}.",
            type="tokens" if d.exceeded == "tokens" else "requests",
            retry_after_s=max(d.retry_after_s, 0.001),
        )
        self.decision = d

    def headers(self) -> dict[str, str]:
        out = super().headers()
        out.update((k.decode(), v.decode()) for k, v in self.decision.headers())
        return out


class LimiterUnavailable(GatewayError):
    """503: Redis cannot answer and ``rate_limits.fail_mode`` is ``closed``."""

    status = 503
    type = "server_error"
    code = "rate_limiter_unavailable"


@dataclass(slots=True)
class Reservation:
    """What an admitted request holds: release it once with ``Limiter.release``."""

    key_id: str
    limits: KeyLimits
    tokens: int
    lease: str
    backend: Any
    released: bool = False


class Limiter(Protocol):
    async def reserve(
        self, key_id: str, limits: KeyLimits, tokens: int
    ) -> tuple[Decision, Reservation | None]:
        """Check all limits of ``key_id`` and reserve 1 request, ``tokens`` tokens and a slot
        when every limit allows it (then the reservation is returned), else nothing."""

    async def release(self, r: Reservation, actual_tokens: int) -> None:
        """Free the slot and correct the token reservation to ``actual_tokens``."""


@dataclass(slots=True)
class _Bucket:
    level: float
    ts: float


@dataclass(slots=True)
class MemoryLimiter:
    """The limits in this process's memory (single replica, or Redis fail-open)."""

    clock: Callable[[], float] = time.monotonic
    _buckets: dict[tuple[str, str], _Bucket] = field(default_factory=dict)
    _inflight: dict[str, int] = field(default_factory=dict)

    def _level(self, key: tuple[str, str], cap: int, now: float) -> float:
        b = self._buckets.get(key)
        if b is None:
            return float(cap)
        return min(float(cap), b.level + (now - b.ts) * cap / WINDOW_S)

    def _set(self, key: tuple[str, str], level: float, now: float) -> None:
        self._buckets[key] = _Bucket(level, now)

    async def reserve(
        self, key_id: str, limits: KeyLimits, tokens: int
    ) -> tuple[Decision, Reservation | None]:
        now = self.clock()
        d = Decision(limits, need_tokens=tokens)
        rcap, tcap, ccap = limits.requests_per_min, limits.tokens_per_min, limits.concurrent
        rl = self._level((key_id, "r"), rcap, now) if rcap else None
        tl = self._level((key_id, "t"), tcap, now) if tcap else None
        inflight = self._inflight.get(key_id, 0)
        d.requests_level, d.tokens_level, d.inflight = rl, tl, inflight
        if rl is not None and rl < 1:
            d.exceeded, d.retry_after_s = "requests", (1 - rl) * WINDOW_S / rcap
        if tl is not None and tl < tokens:
            wait = WINDOW_S if tokens > tcap else (tokens - tl) * WINDOW_S / tcap
            if d.exceeded is None or wait > d.retry_after_s:
                d.exceeded, d.retry_after_s = "tokens", wait
        if d.exceeded is None and ccap and inflight >= ccap:
            d.exceeded, d.retry_after_s = "concurrent", 1.0
        if d.exceeded is not None:
            return d, None
        if rl is not None:
            d.requests_level = rl - 1
            self._set((key_id, "r"), rl - 1, now)
        if tl is not None:
            d.tokens_level = tl - tokens
            self._set((key_id, "t"), tl - tokens, now)
        if ccap:
            self._inflight[key_id] = d.inflight = inflight + 1
        return d, Reservation(key_id, limits, tokens, "", self)

    async def release(self, r: Reservation, actual_tokens: int) -> None:
        if r.released:
            return
        r.released = True
        if r.limits.concurrent:
            n = self._inflight.get(r.key_id, 0) - 1
            if n > 0:
                self._inflight[r.key_id] = n
            else:
                self._inflight.pop(r.key_id, None)
        cap = r.limits.tokens_per_min
        if cap and actual_tokens != r.tokens:
            now = self.clock()
            level = self._level((r.key_id, "t"), cap, now) + r.tokens - actual_tokens
            self._set((r.key_id, "t"), min(float(cap), level), now)

    def inflight(self, key_id: str) -> int:
        """Concurrency slots ``key_id`` holds now."""
        return self._inflight.get(key_id, 0)


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
    ``redis.asyncio.Redis`` with short timeouts; ``fallback``: the limiter used while Redis
    cannot answer under ``fail_mode`` ``open``."""

    def __init__(
        self,
        client: Any,
        *,
        prefix: str = "speedgate:rl:",
        slot_ttl_s: float = 3600.0,
        fail_mode: str = "open",
        breaker: CircuitBreaker | None = None,
        fallback: MemoryLimiter | None = None,
    ) -> None:
        self.client = client
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
    ) -> tuple[Decision, Reservation | None]:
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
    ) -> tuple[Decision, Reservation | None]:
        exceeded = res[0].decode() if isinstance(res[0], bytes) else str(res[0])
        rl, tl, wait = (float(x) for x in res[1:4])
        d = Decision(
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
        await self.client.aclose()


async def release(r: Reservation | None, actual_tokens: int) -> None:
    """Release ``r`` on the backend that reserved it (no-op for None or already released)."""
    if r is not None and not r.released:
        await r.backend.release(r, actual_tokens)
