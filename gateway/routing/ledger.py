"""Active sessions per replica: the "balls" of the bounded-load rule (DESIGN §5).

Consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam 2018) bounds how many
*clients* each bin holds. For agent sessions the client is the session: a session bound to a
replica sends its next turns there, so the number of live sessions a replica holds predicts its
load far better than the requests in flight at one instant (which swing with every think time).
A session is active on the replica that served its last request for ``idle_s`` seconds after
it. Memory-bounded (at most ``max_entries`` sessions and ``max_bytes`` bytes of them, counted
as ``table.entry_bytes``; least recently seen forgotten first);
local to this gateway process (with several gateway replicas each counts the sessions it
routed, which with shared bindings converges on the same picture). Clock injected for tests.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable

from gateway.routing.table import entry_bytes


class SessionLedger:
    """``touch(session, replica)`` on every pick; ``counts()``: active sessions per replica."""

    def __init__(
        self, idle_s: float, max_entries: int = 50_000,
        clock: Callable[[], float] = time.monotonic, max_bytes: int | None = None,
    ) -> None:
        self.idle_s = idle_s
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.bytes = 0
        self._clock = clock
        self._d: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._counts: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._d)

    def _drop(self, session: str) -> None:
        name, _ = self._d.pop(session)
        self.bytes -= entry_bytes(session)
        self._counts[name] -= 1
        if self._counts[name] <= 0:
            del self._counts[name]

    def _expire(self, now: float) -> None:
        d = self._d
        while d:
            session, (_, seen) = next(iter(d.items()))
            within = self.max_bytes is None or self.bytes <= self.max_bytes
            if now - seen <= self.idle_s and len(d) <= self.max_entries and within:
                break
            self._drop(session)

    def touch(self, session: str, replica: str, now: float | None = None) -> None:
        """``session`` was just routed to ``replica`` (it moves there if it was elsewhere)."""
        now = self._clock() if now is None else now
        if session in self._d:
            self._drop(session)
        self._d[session] = (replica, now)
        self.bytes += entry_bytes(session)
        self._counts[replica] += 1
        self._expire(now)

    def replica_of(self, session: str, now: float | None = None) -> str | None:
        """The replica ``session`` is active on, or None (unknown or idle too long)."""
        self._expire(self._clock() if now is None else now)
        hit = self._d.get(session)
        return hit[0] if hit is not None else None

    def counts(self, now: float | None = None, without: str | None = None) -> dict[str, int]:
        """Active sessions per replica name, not counting session ``without``."""
        self._expire(self._clock() if now is None else now)
        out = dict(self._counts)
        hit = self._d.get(without) if without is not None else None
        if hit is not None:
            out[hit[0]] -= 1
        return out
