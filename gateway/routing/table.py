"""A bounded key → replica table with LRU eviction and a TTL per entry (in-memory state).

Bounded by entries and by memory: at most ``max_entries`` entries and at most ``max_bytes``
bytes of them (``entry_bytes``: the key's own size plus ``ENTRY_OVERHEAD_BYTES`` for the
dict slot, the LRU link, the (replica name, expiry) tuple and the float, measured with
``tracemalloc`` on CPython 3.11: ~185 bytes per entry beyond the key); the least recently used
entries go first. Block keys are 8-byte digests and session keys carry at most a 200-character id
(``gateway.common.ids``), so the entry bound is the usual one; the byte bound holds whatever
the keys are. (production-stack's unbounded prefix trie grew until the router was OOM-killed;
a bounded table forgets old prefixes instead.) Clock injected for tests; times in seconds.
"""

from __future__ import annotations

import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable

#: Bytes one entry costs beyond its key (measured, see the module docstring; rounded up).
ENTRY_OVERHEAD_BYTES = 192


def entry_bytes(key: Hashable) -> int:
    """Approximate bytes one table entry keyed by ``key`` holds: ``sys.getsizeof(key)`` plus
    ``ENTRY_OVERHEAD_BYTES``."""
    return ENTRY_OVERHEAD_BYTES + sys.getsizeof(key)


class AffinityTable:
    """``get(key)`` → replica name or None (expired entries vanish); ``put(key, name)``.
    ``max_bytes`` None: bounded by entries only. ``bytes``: what the entries hold now."""

    def __init__(
        self,
        max_entries: int,
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
        max_bytes: int | None = None,
    ) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self._clock = clock
        self._d: OrderedDict[Hashable, tuple[str, float]] = OrderedDict()
        self.bytes = 0
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._d)

    def get(self, key: Hashable) -> str | None:
        """The replica name bound to ``key``, refreshing its LRU position; None if absent or
        expired."""
        hit = self._d.get(key)
        if hit is None:
            return None
        if hit[1] <= self._clock():
            del self._d[key]
            self.bytes -= entry_bytes(key)
            return None
        self._d.move_to_end(key)
        return hit[0]

    def delete(self, key: Hashable) -> bool:
        """Forget ``key`` (a session that ended); True when it was there."""
        if self._d.pop(key, None) is None:
            return False
        self.bytes -= entry_bytes(key)
        return True

    def put(self, key: Hashable, name: str) -> None:
        """Bind ``key`` to replica ``name`` for ``ttl_s``; evicts least recently used entries
        while over ``max_entries`` or ``max_bytes``."""
        d = self._d
        if key not in d:
            self.bytes += entry_bytes(key)
        d[key] = (name, self._clock() + self.ttl_s)
        d.move_to_end(key)
        cap = self.max_bytes
        while len(d) > self.max_entries or (cap is not None and self.bytes > cap and d):
            old, _ = d.popitem(last=False)
            self.bytes -= entry_bytes(old)
            self.evicted += 1
