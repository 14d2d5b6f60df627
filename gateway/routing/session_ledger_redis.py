"""Active sessions per replica shared by every gateway replica through Redis: the bounded-load
rule's "balls" (``session_ledger``) counted once for the whole deployment.

With a per-process ledger, N gateway replicas each count only the sessions they routed, about
1/N of them, so each applies the bound ``ceil(c × (S + 1) / n)`` to a picture that misses most
of the load: two gateways binding new sessions while each believes the replicas the other
filled are empty piled them 7/3/0/0 on four replicas in one run. Here the counts
every gateway binds by are the same.

Layout: one sorted set per replica, ``{prefix}{<pool>}:act:<replica name>``, member = the session
key (a fixed-size id, ``gateway.common.ids``), score = when it was last routed (milliseconds on
Redis' clock, ``TIME``, so gateway clocks need not agree). ``touch`` (every pick; fire and
forget) moves the session into its replica's set and out of the pool's others; ``counts`` (only
when a session is being bound) drops members idle longer than ``session_idle_s`` and counts each
set. One script call each, on the pool's keys (one hash tag: one cluster slot). Memory in Redis:
the sessions active in the last ``session_idle_s``; every set expires ``2 × session_idle_s``
after its last write.

Every call goes through the gateway's shared circuit breaker with the routing store's timeout;
when Redis cannot answer, ``counts`` returns the local ledger's (this process's) counts, which
``touch`` keeps up to date too: the bound then holds per gateway, as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from gateway.common.breaker import CircuitBreaker
from gateway.routing.session_ledger import SessionLedger

# KEYS: the sets of every replica of the pool, the session's new replica first.
# ARGV: 1 session key, 2 idle window (ms).
TOUCH_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local idle = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - idle)
redis.call('PEXPIRE', KEYS[1], 2 * idle)
for i = 2, #KEYS do redis.call('ZREM', KEYS[i], ARGV[1]) end
return 1
"""

# KEYS: the sets of the candidate replicas. ARGV: 1 idle window (ms), 2 session not to count.
# Returns the active sessions of each, in KEYS order.
COUNTS_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i = 1, #KEYS do
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now - tonumber(ARGV[1]))
  local n = redis.call('ZCARD', KEYS[i])
  if ARGV[2] ~= '' and redis.call('ZSCORE', KEYS[i], ARGV[2]) then n = n - 1 end
  out[i] = n
end
return out
"""


# KEYS: the sets of every replica of the pool. ARGV: 1 session key.
FORGET_LUA = """
for i = 1, #KEYS do redis.call('ZREM', KEYS[i], ARGV[1]) end
return 1
"""


class RedisSessionLedger:
    """The active-session counts of one pool, in Redis (see the module docstring); ``local``
    is this process's ledger, kept in step and used while Redis cannot answer."""

    def __init__(
        self,
        client: Any,
        breaker: CircuitBreaker,
        local: SessionLedger,
        *,
        pool: str,
        prefix: str = "speedgate:route:",
        timeout_s: float = 0.1,
    ) -> None:
        self.breaker = breaker
        self.local = local
        self.pool = pool
        self.prefix = prefix
        self.timeout_s = timeout_s
        self.idle_ms = max(1, round(local.idle_s * 1000))
        self._touch = client.register_script(TOUCH_LUA)
        self._counts = client.register_script(COUNTS_LUA)
        self._forget = client.register_script(FORGET_LUA)
        self._pending: set[asyncio.Task[None]] = set()

    def key(self, replica: str) -> str:
        """The Redis key of ``replica``'s active sessions."""
        return f"{self.prefix}{{{self.pool}}}:act:{replica}"

    async def _call(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        if not self.breaker.allow():
            return None
        try:
            async with asyncio.timeout(self.timeout_s * 3):
                out = await script(keys=keys, args=args)
        except Exception as e:  # redis errors, timeouts, OSError: the local counts serve
            self.breaker.failure(e)
            return None
        self.breaker.success()
        return out

    def touch(self, session: str, replica: str, now: float, pool_replicas: Sequence[str]) -> None:
        """``session`` was routed to ``replica`` (one of ``pool_replicas``, the pool's replica
        names now) at ``now`` (monotonic s): into the local ledger at once, into Redis in the
        background (``drain`` waits for it)."""
        self.local.touch(session, replica, now)
        others = [self.key(r) for r in pool_replicas if r != replica]
        coro = self._call(self._touch, [self.key(replica), *others], [session, self.idle_ms])
        task = asyncio.get_running_loop().create_task(coro)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def forget(self, session: str, pool_replicas: Sequence[str]) -> None:
        """``session`` ended: out of the local ledger and out of every replica's set in
        Redis (``ZREM``; nothing when Redis cannot answer: it then ages out of the sets after
        ``session_idle_s``)."""
        self.local.forget(session)
        keys = [self.key(r) for r in pool_replicas]
        if keys:
            await self._call(self._forget, keys, [session])

    async def counts(self, now: float, without: str, replicas: Sequence[str]) -> dict[str, int]:
        """Active sessions on each of ``replicas`` across every gateway, not counting session
        ``without``; this process's counts when Redis cannot answer."""
        got = await self._call(self._counts, [self.key(r) for r in replicas],
                               [self.idle_ms, without])
        if got is None or len(got) != len(replicas):
            return self.local.counts(now, without=without)
        return {r: int(n) for r, n in zip(replicas, got, strict=True)}

    async def drain(self) -> None:
        """Wait for the Redis writes under way (tests, shutdown)."""
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)
