"""A bounded key → replica table with LRU eviction and a TTL per entry (in-memory state).

Memory-bounded by construction: at most ``max_entries`` entries (the least recently used goes
first), each entry an 8-byte key (or a short session key) and a tuple (replica name, expiry):
about 120-200 bytes per entry in CPython, so the default 200,000 entries stay under ~40 MB per
pool. (production-stack's unbounded prefix trie grew until the router was OOM-killed; a bounded
table forgets old prefixes instead.) Clock injected for tests; times in seconds.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable


class AffinityTable:
    """``get(key)`` → replica name or None (expired entries vanish); ``put(key, name)``."""

    def __init__(
        self,
        max_entries: int,
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._clock = clock
        self._d: OrderedDict[Hashable, tuple[str, float]] = OrderedDict()
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
            return None
        self._d.move_to_end(key)
        return hit[0]

    def put(self, key: Hashable, name: str) -> None:
        """Bind ``key`` to replica ``name`` for ``ttl_s``; evicts the LRU entry when full."""
        d = self._d
        d[key] = (name, self._clock() + self.ttl_s)
        d.move_to_end(key)
        while len(d) > self.max_entries:
            d.popitem(last=False)
            self.evicted += 1
