"""Per-key and per-session usage totals: requests, tokens by type, cost, sums of
TTFT and end-to-end time, behind one interface with two implementations.

- ``MemoryUsageStore``: one process (the default); sessions kept in LRU order, at most
  ``max_sessions``.
- ``RedisUsageStore``: shared by every gateway replica (redis-py asyncio, ``redis>=5``). One
  hash per key and per session (``{prefix}key:{id}``, ``{prefix}session:{key}/{id}``), updated by
  ``HINCRBY``/``HINCRBYFLOAT`` in one ``MULTI`` pipeline so a reader never sees half a request;
  sessions expire ``session_ttl_s`` after their last request. Short socket timeouts (100 ms by
  default, case redis-outage) and the circuit breaker of the gateway's shared Redis connection
  (``gateway.common.redis_conn``): while it is open Redis is skipped (adds are dropped and
  counted in ``dropped``, reads answer ``UsageStoreUnavailable`` at once).

A session is a session id within one API key (``session_scope``: ``{key_id}/{session_id}``,
``-`` for the key with auth off), as budgets and routing scope it: two keys sending one id
have two totals.

``add()`` never raises: accounting must not fail a request that was served (call it after the
response is complete). ``get_key``/``get_session`` raise ``UsageStoreUnavailable`` when the
store cannot answer (an admin endpoint answers 503). Times in seconds, cost in USD. Ids longer
than 200 characters are stored under their SHA-256 (``gateway.common.ids.bounded_id``).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, fields
from typing import Any, Protocol

from gateway.common.breaker import CircuitBreaker
from gateway.common.ids import bounded_id

log = logging.getLogger("speedgate.usage")

_INT_FIELDS = (
    "requests",
    "errors",
    "input_tokens",
    "cached_input_tokens",
    "output_tokens",
    "estimated_requests",
    "ttft_count",
)


class UsageStoreUnavailable(Exception):
    """The store could not be read (Redis down or timing out)."""


@dataclass(slots=True)
class UsageDelta:
    """What one finished request adds. ``ttft_s`` only when a first token was timed."""

    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    ttft_s: float | None = None
    e2e_s: float = 0.0
    error: bool = False
    estimated: bool = False

    @classmethod
    def from_record(cls, rec: Any) -> UsageDelta:
        """From a ``RequestRecord`` (usage, cost_usd, ttft_s, e2e_s, outcome)."""
        u = rec.usage
        return cls(
            input_tokens=u.prompt if u else 0,
            cached_input_tokens=u.cached if u else 0,
            output_tokens=u.completion if u else 0,
            cost_usd=rec.cost_usd or 0.0,
            ttft_s=rec.ttft_s if rec.stream else None,
            e2e_s=rec.e2e_s or 0.0,
            error=rec.outcome != "ok",
            estimated=rec.usage_estimated,
        )


@dataclass(slots=True)
class UsageTotals:
    """Totals of a key or a session. ``first_seen``/``last_seen``: Unix seconds (0 if none)."""

    requests: int = 0
    errors: int = 0
    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0
    estimated_requests: int = 0
    cost_usd: float = 0.0
    ttft_s_sum: float = 0.0
    ttft_count: int = 0
    e2e_s_sum: float = 0.0
    first_seen: float = 0.0
    last_seen: float = 0.0
    #: how the session ended: ``explicit`` (``x-speedgate-session-end``) or ``idle``; "" while
    #: it has not (or for a key)
    ended: str = ""

    def add(self, d: UsageDelta, now: float) -> None:
        """Add one request's delta at ``now`` (Unix seconds)."""
        self.requests += 1
        self.errors += int(d.error)
        self.input_tokens += d.input_tokens
        self.cached_input_tokens += d.cached_input_tokens
        self.output_tokens += d.output_tokens
        self.estimated_requests += int(d.estimated)
        self.cost_usd += d.cost_usd
        if d.ttft_s is not None:
            self.ttft_s_sum += d.ttft_s
            self.ttft_count += 1
        self.e2e_s_sum += d.e2e_s
        self.first_seen = self.first_seen or now
        self.last_seen = now

    def merged(self, other: UsageTotals) -> UsageTotals:
        """The sum of two totals (a session and its subagents): counts, tokens, cost and time
        sums added, ``first_seen`` the earlier (0 counts as none), ``last_seen`` the later;
        ``ended`` is this one's."""
        out = UsageTotals(ended=self.ended)
        for f in fields(UsageTotals):
            if f.name not in ("first_seen", "last_seen", "ended"):
                setattr(out, f.name, getattr(self, f.name) + getattr(other, f.name))
        firsts = [t for t in (self.first_seen, other.first_seen) if t]
        out.first_seen = min(firsts) if firsts else 0.0
        out.last_seen = max(self.last_seen, other.last_seen)
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready totals plus the means (``ttft_s_mean``, ``e2e_s_mean``; None if none);
        ``ended`` None while the session has not ended."""
        out = asdict(self)
        out["ended"] = self.ended or None
        out["ttft_s_mean"] = self.ttft_s_sum / self.ttft_count if self.ttft_count else None
        out["e2e_s_mean"] = self.e2e_s_sum / self.requests if self.requests else None
        return out

    @classmethod
    def from_hash(cls, h: dict[Any, Any]) -> UsageTotals:
        """From a Redis hash (bytes or str keys and values)."""
        vals = {(k.decode() if isinstance(k, bytes) else k): v for k, v in h.items()}
        t = cls()
        for f in fields(cls):
            v = vals.get(f.name)
            if v is None:
                continue
            v = v.decode() if isinstance(v, bytes) else v
            if f.name == "ended":
                t.ended = v
                continue
            setattr(t, f.name, int(v) if f.name in _INT_FIELDS else float(v))
        return t


class UsageStore(Protocol):
    """Per-key and per-session usage totals."""

    async def add(self, key_id: str | None, session_id: str | None, delta: UsageDelta,
                  parent: str | None = None) -> None:
        """Add ``delta`` to the key's and the session's totals (either may be None); a
        subagent's session names its ``parent`` session (of the same key): the link is kept
        for ``children``."""

    async def children(self, key_id: str | None, session_id: str) -> list[str]:
        """The sessions that named ``session_id`` their parent (at most ``MAX_CHILDREN``)."""

    async def end(self, key_id: str | None, session_id: str, how: str) -> None:
        """Mark the session ended ``how`` (``explicit`` or ``idle``); its totals stay."""

    async def get_key(self, key_id: str) -> UsageTotals:
        """Totals of ``key_id`` (zeros when unknown)."""

    async def get_session(self, key_id: str | None, session_id: str) -> UsageTotals:
        """Totals of ``session_id`` of API key ``key_id`` (zeros when unknown)."""

    async def close(self) -> None:
        """Release connections."""


_id = bounded_id
#: Children (subagent sessions) kept and listed per session.
MAX_CHILDREN = 1000


def session_scope(key_id: str | None, session_id: str) -> str:
    """The stored name of a session's totals: ``{key_id}/{session_id}`` (``-`` for no key),
    the session id bounded like every id (``bounded_id``)."""
    return f"{key_id or '-'}/{_id(session_id)}"


class MemoryUsageStore:
    """In-process totals (single gateway replica)."""

    def __init__(self, max_sessions: int = 100_000) -> None:
        self.max_sessions = max_sessions
        self._keys: dict[str, UsageTotals] = {}
        self._sessions: OrderedDict[str, UsageTotals] = OrderedDict()
        # scoped parent → child ids in order; an LRU bounded like the sessions (a parent may
        # be named without ever sending a request of its own)
        self._children: OrderedDict[str, dict[str, None]] = OrderedDict()

    async def add(self, key_id: str | None, session_id: str | None, delta: UsageDelta,
                  parent: str | None = None) -> None:
        now = time.time()
        if key_id is not None:
            self._keys.setdefault(_id(key_id), UsageTotals()).add(delta, now)
        if session_id is not None:
            sid = session_scope(key_id, session_id)
            totals = self._sessions.get(sid)
            if totals is None:
                totals = self._sessions[sid] = UsageTotals()
                if len(self._sessions) > self.max_sessions:
                    old, _ = self._sessions.popitem(last=False)
                    self._children.pop(old, None)
            else:
                self._sessions.move_to_end(sid)
            totals.add(delta, now)
            totals.ended = ""  # a turn after its end: the session goes on
            if parent is not None:
                pid = session_scope(key_id, parent)
                kids = self._children.get(pid)
                if kids is None:
                    kids = self._children[pid] = {}
                    if len(self._children) > self.max_sessions:
                        self._children.popitem(last=False)
                else:
                    self._children.move_to_end(pid)
                if len(kids) < MAX_CHILDREN:
                    kids[_id(session_id)] = None

    async def children(self, key_id: str | None, session_id: str) -> list[str]:
        return list(self._children.get(session_scope(key_id, session_id), ()))

    async def end(self, key_id: str | None, session_id: str, how: str) -> None:
        totals = self._sessions.get(session_scope(key_id, session_id))
        if totals is not None:
            totals.ended = how

    async def get_key(self, key_id: str) -> UsageTotals:
        return self._keys.get(_id(key_id)) or UsageTotals()

    async def get_session(self, key_id: str | None, session_id: str) -> UsageTotals:
        return self._sessions.get(session_scope(key_id, session_id)) or UsageTotals()

    async def close(self) -> None:
        return None


class RedisUsageStore:
    """Totals in Redis, shared by gateway replicas. ``client`` is a ``redis.asyncio.Redis``
    and ``breaker`` its circuit breaker (the gateway's shared ``RedisConnection``); without
    one, a breaker of ``breaker_failures`` / ``breaker_cooldown_s`` is built. ``from_url``
    builds a client with the short timeouts (closed by ``close``: ``owns_client``)."""

    def __init__(
        self,
        client: Any,
        *,
        prefix: str = "speedgate:usage:",
        session_ttl_s: int = 7 * 24 * 3600,
        breaker: CircuitBreaker | None = None,
        breaker_failures: int = 3,
        breaker_cooldown_s: float = 5.0,
        owns_client: bool = False,
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.session_ttl_s = session_ttl_s
        self.breaker = breaker or CircuitBreaker(
            "usage", failures=breaker_failures, cooldown_s=breaker_cooldown_s
        )
        self.owns_client = owns_client
        self.dropped = 0  # adds lost to a Redis failure or an open breaker

    @classmethod
    def from_url(cls, url: str, *, timeout_s: float = 0.1, **kwargs: Any) -> RedisUsageStore:
        """A store on a new client for ``url`` (``redis://host:6379/0``) with socket connect
        and read timeouts of ``timeout_s`` seconds."""
        from gateway.common.redis_client import redis_client

        client = redis_client(url, timeout_s=timeout_s, connect_timeout_s=timeout_s)
        return cls(client, owns_client=True, **kwargs)

    def key_hash(self, key_id: str) -> str:
        """The Redis key of ``key_id``'s totals."""
        return f"{self.prefix}key:{_id(key_id)}"

    def session_hash(self, key_id: str | None, session_id: str) -> str:
        """The Redis key of the totals of ``session_id`` of API key ``key_id``."""
        return f"{self.prefix}session:{session_scope(key_id, session_id)}"

    def children_key(self, key_id: str | None, session_id: str) -> str:
        """The Redis set of the sessions that named ``session_id`` their parent."""
        return f"{self.prefix}children:{session_scope(key_id, session_id)}"

    def _queue(self, pipe: Any, name: str, d: UsageDelta, now: float) -> None:
        pipe.hincrby(name, "requests", 1)
        if d.error:
            pipe.hincrby(name, "errors", 1)
        for f in ("input_tokens", "cached_input_tokens", "output_tokens"):
            if getattr(d, f):
                pipe.hincrby(name, f, getattr(d, f))
        if d.estimated:
            pipe.hincrby(name, "estimated_requests", 1)
        if d.cost_usd:
            pipe.hincrbyfloat(name, "cost_usd", d.cost_usd)
        if d.ttft_s is not None:
            pipe.hincrbyfloat(name, "ttft_s_sum", d.ttft_s)
            pipe.hincrby(name, "ttft_count", 1)
        pipe.hincrbyfloat(name, "e2e_s_sum", d.e2e_s)
        pipe.hsetnx(name, "first_seen", now)
        pipe.hset(name, "last_seen", now)

    async def add(self, key_id: str | None, session_id: str | None, delta: UsageDelta,
                  parent: str | None = None) -> None:
        if key_id is None and session_id is None:
            return
        if not self.breaker.allow():
            self.dropped += 1
            return
        now = time.time()
        try:
            async with self.client.pipeline(transaction=True) as pipe:
                if key_id is not None:
                    self._queue(pipe, self.key_hash(key_id), delta, now)
                if session_id is not None:
                    name = self.session_hash(key_id, session_id)
                    self._queue(pipe, name, delta, now)
                    pipe.hdel(name, "ended")
                    if parent is not None:
                        pipe.hset(name, "parent", _id(parent))
                        kids = self.children_key(key_id, parent)
                        pipe.sadd(kids, _id(session_id))
                        pipe.expire(kids, self.session_ttl_s)
                    pipe.expire(name, self.session_ttl_s)
                await pipe.execute()
        except Exception as e:  # redis errors, timeouts, OSError: never fail the request
            self.dropped += 1
            self.breaker.failure(e)
            return
        self.breaker.success()

    async def _get(self, name: str) -> UsageTotals:
        if not self.breaker.allow():
            raise UsageStoreUnavailable("Redis unavailable (circuit open)")
        try:
            h = await self.client.hgetall(name)
        except Exception as e:
            self.breaker.failure(e)
            raise UsageStoreUnavailable(f"Redis read failed: {e!r}") from None
        self.breaker.success()
        return UsageTotals.from_hash(h)

    async def get_key(self, key_id: str) -> UsageTotals:
        return await self._get(self.key_hash(key_id))

    async def children(self, key_id: str | None, session_id: str) -> list[str]:
        if not self.breaker.allow():
            raise UsageStoreUnavailable("Redis unavailable (circuit open)")
        try:
            got = await self.client.srandmember(self.children_key(key_id, session_id),
                                                MAX_CHILDREN)
        except Exception as e:
            self.breaker.failure(e)
            raise UsageStoreUnavailable(f"Redis read failed: {e!r}") from None
        self.breaker.success()
        return sorted(m.decode() if isinstance(m, bytes) else m for m in got or ())

    async def end(self, key_id: str | None, session_id: str, how: str) -> None:
        name = self.session_hash(key_id, session_id)
        if not self.breaker.allow():
            return
        try:
            if await self.client.exists(name):
                await self.client.hset(name, "ended", how)
        except Exception as e:  # accounting never fails a request
            self.breaker.failure(e)
            return
        self.breaker.success()

    async def get_session(self, key_id: str | None, session_id: str) -> UsageTotals:
        return await self._get(self.session_hash(key_id, session_id))

    async def close(self) -> None:
        if self.owns_client:
            await self.client.aclose()


__all__ = [
    "MAX_CHILDREN",
    "MemoryUsageStore",
    "RedisUsageStore",
    "UsageDelta",
    "UsageStore",
    "UsageStoreUnavailable",
    "UsageTotals",
    "session_scope",
]
