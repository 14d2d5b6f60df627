"""Active sessions per replica: the "balls" of the bounded-load rule.

Consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam 2018) bounds how many
*clients* each bin holds. For agent sessions the client is the session: a session bound to a
replica sends its next turns there, so the number of live sessions a replica holds predicts its
load far better than the requests in flight at one instant (which swing with every think time).
A session is active on the replica that served its last request for ``idle_s`` seconds after
it. Memory-bounded (at most ``max_entries`` sessions and ``max_bytes`` bytes of them, counted
as ``table.entry_bytes``; least recently seen forgotten first);
local to this gateway process (with several gateway replicas each counts the sessions it
routed, which with shared bindings converges on the same picture). Clock injected for tests.

Each entry also keeps the session's **size** (characters of its conversation at its last turn:
the prefix its replica caches, so what moving it would cost to prefill again) and how many
replicas were **candidates when it was bound** to its replica. A session bound while fewer
replicas were usable than now (during an outage, or away from a replica that failed it) may be
shed by a replica holding more than its share, cheapest first (``cheaper_on``); one bound with
every replica to choose from never is.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import NamedTuple

from gateway.routing.table import entry_bytes


class _Entry(NamedTuple):
    replica: str
    seen: float  # monotonic s of its last request
    size: int  # characters of its conversation then
    bound_among: int  # candidates when it was bound to ``replica``


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
        self._d: OrderedDict[str, _Entry] = OrderedDict()
        self._counts: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._d)

    def _drop(self, session: str) -> None:
        name = self._d.pop(session).replica
        self.bytes -= entry_bytes(session)
        self._counts[name] -= 1
        if self._counts[name] <= 0:
            del self._counts[name]

    def _expire(self, now: float) -> None:
        d = self._d
        while d:
            session, entry = next(iter(d.items()))
            within = self.max_bytes is None or self.bytes <= self.max_bytes
            if now - entry.seen <= self.idle_s and len(d) <= self.max_entries and within:
                break
            self._drop(session)

    def touch(
        self, session: str, replica: str, now: float | None = None, size: int = 0,
        candidates: int = 0,
    ) -> None:
        """``session`` was just routed to ``replica`` (it moves there if it was elsewhere);
        ``size``: its conversation in characters; ``candidates``: replicas it could have been
        routed to (kept from its binding while it stays on ``replica``)."""
        now = self._clock() if now is None else now
        old = self._d.get(session)
        if old is not None:
            self._drop(session)
            if old.replica == replica:
                candidates = old.bound_among
        self._d[session] = _Entry(replica, now, size, candidates)
        self.bytes += entry_bytes(session)
        self._counts[replica] += 1
        self._expire(now)

    def forget(self, session: str) -> bool:
        """Drop ``session`` (it ended): no longer counted on its replica. True when it was
        active."""
        if session not in self._d:
            return False
        self._drop(session)
        return True

    def replica_of(self, session: str, now: float | None = None) -> str | None:
        """The replica ``session`` is active on, or None (unknown or idle too long)."""
        self._expire(self._clock() if now is None else now)
        hit = self._d.get(session)
        return hit.replica if hit is not None else None

    def counts(self, now: float | None = None, without: str | None = None) -> dict[str, int]:
        """Active sessions per replica name, not counting session ``without``."""
        self._expire(self._clock() if now is None else now)
        out = dict(self._counts)
        hit = self._d.get(without) if without is not None else None
        if hit is not None:
            out[hit.replica] -= 1
        return out

    def movable(self, session: str, candidates: int) -> bool:
        """True when ``session`` is active and was bound among fewer than ``candidates``
        replicas (so it may be shed now that more are usable)."""
        hit = self._d.get(session)
        return hit is not None and hit.bound_among < candidates

    def cheaper_on(self, replica: str, session: str, candidates: int) -> int:
        """How many other movable sessions (bound among fewer than ``candidates`` replicas)
        active on ``replica`` are cheaper to move than ``session``: a shorter conversation at
        their last turn, or as short with a smaller key (a strict order, the same on every
        call). O(active sessions); asked only of a replica over its share."""
        me = (self._d[session].size, session)
        return sum(1 for key, e in self._d.items()
                   if e.replica == replica and e.bound_among < candidates and key != session
                   and (e.size, key) < me)
