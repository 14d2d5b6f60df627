"""Routing state: session → replica and prefix block → replica bindings, per pool.

One interface, two implementations:

- ``MemoryRoutingStore`` (default, one gateway replica): two bounded LRU + TTL tables per pool
  (``gateway.routing.table``).
- ``RedisRoutingStore`` (several gateway replicas agree): plain string keys with a TTL,
  ``{prefix}{pool}:s:{session digest}`` and ``{prefix}{pool}:b:{block hash hex}``, value = the
  replica's name (``model/tier/index``, never its URL). A lookup is one pipelined round trip
  (``GET`` + ``MGET``), a record one pipeline of ``SET … EX``. Memory in Redis is bounded by the
  TTL and the keys per request (``keys.sampled_indices``); run Redis with a ``maxmemory`` policy
  (``allkeys-lru``) for a hard bound. Every call goes through the shared ``CircuitBreaker``
  with a short socket timeout: a failed or skipped call returns None (lookup) or does nothing
  (record), and the router falls back to consistent hashing on the session key.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.common.breaker import CircuitBreaker
from gateway.routing.table import AffinityTable

log = logging.getLogger("speedgate.routing")


@dataclass(slots=True)
class Lookup:
    """What the store knows about one request: the session's replica, and per replica the
    number of leading blocks it holds (deepest recorded block index + 1)."""

    session: str | None = None
    depth: dict[str, int] = field(default_factory=dict)


class RoutingStore(Protocol):
    """Session and prefix bindings of every pool."""

    @property
    def degraded(self) -> bool:
        """True while the shared store is unreachable (routing on consistent hashing)."""

    async def lookup(
        self, pool: str, session: str, blocks: list[bytes], indices: list[int]
    ) -> Lookup | None:
        """Bindings of ``session`` and of ``blocks[i]`` for ``i`` in ``indices`` (deepest
        first); None when the store cannot answer."""

    async def record(
        self, pool: str, session: str, blocks: list[bytes], indices: list[int], replica: str
    ) -> None:
        """Bind ``session`` and ``blocks[i]`` (``i`` in ``indices``) to ``replica``."""

    def record_nowait(
        self, pool: str, session: str, blocks: list[bytes], indices: list[int], replica: str
    ) -> bool:
        """``record`` done at once when it needs no I/O (an in-process store): True; False
        when the caller must await ``record`` (in a task of its own: a shared store)."""

    async def forget(self, pool: str, session: str) -> None:
        """Drop ``session``'s binding in ``pool`` (the session ended); its prefix blocks stay,
        shared with any conversation that starts the same way."""

    async def ping(self) -> bool:
        """One cheap call, so an idle gateway notices that Redis came back."""

    async def close(self) -> None:
        """Release connections."""


def _depths(indices: list[int], names: list[Any]) -> dict[str, int]:
    depth: dict[str, int] = {}
    for i, name in zip(indices, names, strict=True):
        if name is None:
            continue
        if isinstance(name, bytes):
            name = name.decode()
        if name not in depth:  # indices are deepest first
            depth[name] = i + 1
    return depth


class MemoryRoutingStore:
    """In-process bindings (a single gateway replica)."""

    degraded = False

    def __init__(self, max_entries: int = 200_000, ttl_s: float = 3600.0) -> None:
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._sessions: dict[str, AffinityTable] = {}
        self._blocks: dict[str, AffinityTable] = {}

    def configure(
        self, pool: str, max_entries: int, ttl_s: float, max_bytes: int | None = None
    ) -> None:
        """Size ``pool``'s tables (its ``routing`` config: entries, and bytes when given);
        sessions get a quarter of each."""
        self._blocks[pool] = AffinityTable(max_entries, ttl_s, max_bytes=max_bytes)
        self._sessions[pool] = AffinityTable(
            max(16, max_entries // 4), ttl_s,
            max_bytes=max_bytes // 4 if max_bytes is not None else None,
        )

    def _tables(self, pool: str) -> tuple[AffinityTable, AffinityTable]:
        if pool not in self._blocks:
            self.configure(pool, self.max_entries, self.ttl_s)
        return self._sessions[pool], self._blocks[pool]

    async def lookup(
        self, pool: str, session: str, blocks: list[bytes], indices: list[int]
    ) -> Lookup | None:
        sessions, table = self._tables(pool)
        names = [table.get(blocks[i]) for i in indices]
        return Lookup(sessions.get(session), _depths(indices, names))

    async def record(
        self, pool: str, session: str, blocks: list[bytes], indices: list[int], replica: str
    ) -> None:
        self.record_nowait(pool, session, blocks, indices, replica)

    def record_nowait(
        self, pool: str, session: str, blocks: list[bytes], indices: list[int], replica: str
    ) -> bool:
        sessions, table = self._tables(pool)
        sessions.put(session, replica)
        for i in reversed(indices):  # shallow first: the deepest ends most recently used
            table.put(blocks[i], replica)
        return True

    async def forget(self, pool: str, session: str) -> None:
        self.forget_nowait(pool, session)

    def forget_nowait(self, pool: str, session: str) -> None:
        """``forget`` without I/O (this store's tables are in-process)."""
        table = self._sessions.get(pool)
        if table is not None:
            table.delete(session)

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        return None


class RedisRoutingStore:
    """Bindings in Redis, shared by gateway replicas. ``client``: a ``redis.asyncio.Redis``
    with short socket timeouts (the gateway's shared ``RedisConnection``, or ``from_url``);
    ``timeout_s`` also bounds each call as a whole. ``close`` closes the client only when
    ``owns_client`` (``from_url``)."""

    def __init__(
        self,
        client: Any,
        breaker: CircuitBreaker,
        *,
        prefix: str = "speedgate:route:",
        ttl_s: float = 3600.0,
        timeout_s: float = 0.1,
        owns_client: bool = False,
    ) -> None:
        self.client = client
        self.owns_client = owns_client
        self.breaker = breaker
        self.prefix = prefix
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self.ttls: dict[str, int] = {}

    @classmethod
    def from_url(
        cls, url: str, breaker: CircuitBreaker, *, timeout_s: float = 0.1, **kwargs: Any
    ) -> RedisRoutingStore:
        """A store on a new client for ``url`` with connect/read timeouts of ``timeout_s``."""
        from gateway.common.redis_client import redis_client

        client = redis_client(url, timeout_s=timeout_s, connect_timeout_s=timeout_s)
        return cls(client, breaker, timeout_s=timeout_s, owns_client=True, **kwargs)

    @property
    def degraded(self) -> bool:
        return self.breaker.degraded

    def configure(
        self, pool: str, max_entries: int, ttl_s: float, max_bytes: int | None = None
    ) -> None:
        """``pool``'s binding TTL (s); Redis bounds memory by TTL and ``maxmemory``."""
        self.ttls[pool] = max(1, round(ttl_s))

    def session_key(self, pool: str, session: str) -> str:
        """The Redis key of ``session``'s binding in ``pool``."""
        digest = hashlib.blake2b(session.encode(), digest_size=12).hexdigest()
        return f"{self.prefix}{pool}:s:{digest}"

    def block_key(self, pool: str, block: bytes) -> str:
        """The Redis key of one prefix block's binding in ``pool``."""
        return f"{self.prefix}{pool}:b:{block.hex()}"

    async def _call(self, fn: Any) -> Any:
        if not self.breaker.allow():
            return None
        try:
            async with asyncio.timeout(self.timeout_s * 3):
                out = await fn()
        except Exception as e:  # redis errors, timeouts, OSError: route without Redis
            self.breaker.failure(e)
            return None
        self.breaker.success()
        return out

    async def lookup(
        self, pool: str, session: str, blocks: list[bytes], indices: list[int]
    ) -> Lookup | None:
        keys = [self.block_key(pool, blocks[i]) for i in indices]

        async def run() -> Any:
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.get(self.session_key(pool, session))
                if keys:
                    pipe.mget(keys)
                return await pipe.execute()

        res = await self._call(run)
        if res is None:
            return None
        bound = res[0].decode() if res[0] is not None else None
        return Lookup(bound, _depths(indices, res[1]) if keys else {})

    async def record(
        self, pool: str, session: str, blocks: list[bytes], indices: list[int], replica: str
    ) -> None:
        ttl = self.ttls.get(pool, max(1, round(self.ttl_s)))

        async def run() -> Any:
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.set(self.session_key(pool, session), replica, ex=ttl)
                for i in indices:
                    pipe.set(self.block_key(pool, blocks[i]), replica, ex=ttl)
                return await pipe.execute()

        await self._call(run)

    def record_nowait(
        self, pool: str, session: str, blocks: list[bytes], indices: list[int], replica: str
    ) -> bool:
        return False  # a network round trip: the caller awaits ``record`` in a task

    async def forget(self, pool: str, session: str) -> None:
        await self._call(lambda: self.client.delete(self.session_key(pool, session)))

    async def ping(self) -> bool:
        return bool(await self._call(self.client.ping))

    async def close(self) -> None:
        if self.owns_client:
            await self.client.aclose()
