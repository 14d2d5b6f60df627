"""Per-key rate limits: requests/min, tokens/min and concurrent requests.

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

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.config import KeyLimits
from gateway.errors import GatewayError

WINDOW_S = 60.0  # limits are per minute


@dataclass(slots=True)
class LimitDecision:
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

    def __init__(self, key_id: str, d: LimitDecision) -> None:
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
    ) -> tuple[LimitDecision, Reservation | None]:
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
    ) -> tuple[LimitDecision, Reservation | None]:
        now = self.clock()
        d = LimitDecision(limits, need_tokens=tokens)
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


async def release(r: Reservation | None, actual_tokens: int) -> None:
    """Release ``r`` on the backend that reserved it (no-op for None or already released)."""
    if r is not None and not r.released:
        await r.backend.release(r, actual_tokens)
