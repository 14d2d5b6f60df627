"""Stored Responses API responses, in this process's memory or in Redis (shared by every
gateway replica), so ``previous_response_id`` works whichever replica serves a turn.

A record is one response: ``{"id", "key", "created_at", "model", "status", "response" (the
response object as the client got it), "items" (this turn's input items), "output" (its output
items), "chain" (ids of the earlier responses of the conversation, oldest first), "root"}``.
Storing each turn's own items plus the chain of ids keeps a conversation of N turns at O(N)
stored bytes (not O(N²) as full copies would be) and still expands in one round trip
(``get_many``: one pipelined ``GETEX`` per record, which also renews every record's TTL, so a
conversation in use never expires part-way).

Errors: ``StoreUnavailable`` when Redis does not answer (the caller answers 503 with
``Retry-After``), never a lost record silently mistaken for a missing one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from typing import Any

import orjson

from gateway.common.breaker import CircuitBreaker
from gateway.protocols.responses.ids import RECORD_SPACE

log = logging.getLogger("speedgate.responses")


class StoreUnavailable(Exception):
    """The shared store could not be read or written (Redis down, timeout, breaker open)."""


class ResponseStore:
    """The interface: records by id; ``ttl_s`` seconds after the last write or read."""

    def __init__(self, *, ttl_s: float, max_record_bytes: int) -> None:
        self.ttl_s = ttl_s
        self.max_record_bytes = max_record_bytes
        self.skipped_too_large = 0  # records not stored: over max_record_bytes

    def encode(self, record: dict[str, Any]) -> bytes | None:
        """The record's bytes, or None (logged, counted) when over ``max_record_bytes``."""
        data = orjson.dumps(record)
        if len(data) > self.max_record_bytes:
            self.skipped_too_large += 1
            log.warning(
                "response %s not stored: %d bytes over responses.max_response_bytes (%d)",
                record.get("id"), len(data), self.max_record_bytes,
            )
            return None
        return data

    async def get_many(self, ids: list[str]) -> list[dict[str, Any] | None]:
        """The records of ``ids`` (None where missing or expired), TTLs renewed."""
        raise NotImplementedError

    async def get(self, response_id: str) -> dict[str, Any] | None:
        """One record, or None."""
        return (await self.get_many([response_id]))[0]

    async def put(self, record: dict[str, Any]) -> bool:
        """Store ``record`` under ``record["id"]``; False when it was too large."""
        raise NotImplementedError

    async def delete(self, response_id: str) -> bool:
        """Remove a record; True when it existed."""
        raise NotImplementedError

    async def close(self) -> None:
        """Release connections."""


class MemoryResponseStore(ResponseStore):
    """Records in an LRU (single gateway process), each expiring ``ttl_s`` seconds after its
    last use, bounded by ``max_entries`` records and ``max_bytes`` bytes of records in all
    (least recently used evicted first; a record over ``max_bytes`` is not stored).

    Expiry is by time, not only on read: every record has the same TTL from its last use, so
    the LRU order is the expiry order; each call drops the expired head records, and a timer
    on the event loop fires when the oldest record expires (then re-arms for the next one), so
    an idle store lets go of its memory too. ``clock`` (seconds, monotonic) is injectable for
    tests; the timer then only fires calls that read it."""

    def __init__(
        self, *, ttl_s: float, max_record_bytes: int, max_entries: int,
        max_bytes: int = 256 * 1024 * 1024, clock: Any = time.monotonic,
    ) -> None:
        super().__init__(ttl_s=ttl_s, max_record_bytes=max_record_bytes)
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._clock = clock
        self._data: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        self.bytes = 0  # bytes of the records held
        self.evicted = 0  # records dropped for the entry or byte bound
        self._timer: asyncio.TimerHandle | None = None

    def _drop(self, rid: str) -> bool:
        entry = self._data.pop(rid, None)
        if entry is None:
            return False
        self.bytes -= len(entry[1])
        return True

    def expire(self) -> int:
        """Drop the records whose TTL has passed; how many."""
        now, n = self._clock(), 0
        while self._data:
            rid, (expires, _) = next(iter(self._data.items()))
            if expires > now:
                break
            self._drop(rid)
            n += 1
        return n

    def _arm(self) -> None:
        """Fire ``_on_timer`` when the oldest record expires (one timer at a time)."""
        if self._timer is not None or not self._data:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        expires = next(iter(self._data.values()))[0]
        self._timer = loop.call_later(max(0.0, expires - self._clock()) + 0.001, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self.expire()
        self._arm()

    async def get_many(self, ids: list[str]) -> list[dict[str, Any] | None]:
        self.expire()
        now = self._clock()
        out: list[dict[str, Any] | None] = []
        for rid in ids:
            entry = self._data.get(rid)
            if entry is None:
                out.append(None)
                continue
            self._data[rid] = (now + self.ttl_s, entry[1])
            self._data.move_to_end(rid)
            out.append(orjson.loads(entry[1]))
        return out

    async def put(self, record: dict[str, Any]) -> bool:
        self.expire()
        data = self.encode(record)
        if data is None:
            return False
        if len(data) > self.max_bytes:
            self.skipped_too_large += 1
            log.warning("response %s not stored: %d bytes over responses.memory_max_bytes (%d)",
                        record.get("id"), len(data), self.max_bytes)
            return False
        rid = record["id"]
        self._drop(rid)
        self._data[rid] = (self._clock() + self.ttl_s, data)
        self.bytes += len(data)
        while len(self._data) > self.max_entries or self.bytes > self.max_bytes:
            self._drop(next(iter(self._data)))
            self.evicted += 1
        self._arm()
        return True

    async def delete(self, response_id: str) -> bool:
        self.expire()
        return self._drop(response_id)

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class RedisResponseStore(ResponseStore):
    """Records as Redis strings ``<prefix>rec:<id>`` with a TTL (``responses.ids``: the run
    markers live in ``<prefix>run:``), behind a circuit breaker.
    ``client`` is a ``redis.asyncio.Redis``."""

    def __init__(
        self,
        client: Any,
        *,
        prefix: str,
        ttl_s: float,
        max_record_bytes: int,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        super().__init__(ttl_s=ttl_s, max_record_bytes=max_record_bytes)
        self.client = client
        self.prefix = prefix
        self.breaker = breaker or CircuitBreaker("responses")

    @classmethod
    def from_url(cls, url: str, *, timeout_s: float, **kwargs: Any) -> RedisResponseStore:
        """A store on a new client for ``url`` with socket timeouts of ``timeout_s`` seconds."""
        from gateway.common.redis_client import redis_client

        client = redis_client(url, timeout_s=timeout_s, connect_timeout_s=timeout_s)
        return cls(client, **kwargs)

    def _key(self, response_id: str) -> str:
        return self.prefix + RECORD_SPACE + response_id

    async def _call(self, fn: Any) -> Any:
        if not self.breaker.allow():
            raise StoreUnavailable("response store: Redis circuit open")
        try:
            result = await fn()
        except Exception as e:  # redis errors, timeouts, OSError
            self.breaker.failure(e)
            reason = type(e).__name__
            raise StoreUnavailable(f"response store: Redis call failed ({reason})") from None
        self.breaker.success()
        return result

    async def get_many(self, ids: list[str]) -> list[dict[str, Any] | None]:
        if not ids:
            return []
        ttl_ms = max(1, int(self.ttl_s * 1000))

        async def run() -> list[Any]:
            async with self.client.pipeline(transaction=False) as pipe:
                for rid in ids:
                    pipe.getex(self._key(rid), px=ttl_ms)
                return await pipe.execute()

        raw = await self._call(run)
        return [orjson.loads(v) if v is not None else None for v in raw]

    async def put(self, record: dict[str, Any]) -> bool:
        data = self.encode(record)
        if data is None:
            return False
        key, ttl_ms = self._key(record["id"]), max(1, int(self.ttl_s * 1000))
        await self._call(lambda: self.client.set(key, data, px=ttl_ms))
        return True

    async def delete(self, response_id: str) -> bool:
        return bool(await self._call(lambda: self.client.delete(self._key(response_id))))

    async def close(self) -> None:
        await self.client.aclose()
