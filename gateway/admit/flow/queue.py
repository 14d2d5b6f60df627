"""The queue discipline of one pool: strict priority bands, fair queuing inside each band
(``fair.FairQueue``), the starvation guard (promotion after ``max_wait_s``) and deadlines.
Pure: every method takes ``now`` (seconds on any monotonic clock); arrivals in, order out.

Order of service: band 0 first; inside a band, requests promoted into it (oldest first), then
the band's fair queue. A caller may cap the lowest band it will take (``pop(lowest=...)``: the
slots reserved for higher bands). A request waiting longer than its current band's
``max_wait_s`` (counted from its arrival) moves up one band, into that band's promoted list.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import count
from typing import Any

from gateway.admit.flow.fair import FairQueue


@dataclass(slots=True, eq=False)
class Waiter:
    """One queued request. ``key``/``session``: its fair-queuing flows; ``cost``: estimated
    tokens (prompt + output); ``band``: its current band (0 = highest); ``arrived`` and
    ``deadline``: seconds on the queue's clock (refused when still queued at ``deadline``);
    ``weight``: its key's fair share; ``payload``: the caller's (e.g. a future)."""

    key: str
    session: str
    cost: float
    band: int
    arrived: float
    deadline: float
    weight: float = 1.0
    first_band: int = -1
    promoted: bool = False
    payload: Any = None
    seq: int = field(default=0)

    def __post_init__(self) -> None:
        if self.first_band < 0:
            self.first_band = self.band


@dataclass(frozen=True, slots=True)
class BandRule:
    """What the discipline needs of a band: ``max_wait_s`` (None = never promoted)."""

    name: str
    max_wait_s: float | None = None


class _Band:
    __slots__ = ("aged", "aged_cost", "fair", "order", "rule")

    def __init__(self, rule: BandRule) -> None:
        self.rule = rule
        self.fair: FairQueue[Waiter] = FairQueue()
        self.aged: deque[Waiter] = deque()
        self.aged_cost = 0.0
        self.order: dict[Waiter, None] = {}  # the fair queue's waiters in arrival order

    def __len__(self) -> int:
        return len(self.fair) + len(self.aged)


class BandedQueue:
    """Waiting requests of one pool, by band. ``len()`` is the total waiting."""

    def __init__(self, bands: Sequence[BandRule]) -> None:
        if not bands:
            raise ValueError("at least one band")
        self.bands = [_Band(b) for b in bands]
        self._deadlines: list[tuple[float, int, Waiter]] = []
        self._seq = count()
        self._n = 0
        self._where: dict[Waiter, int] = {}

    def __len__(self) -> int:
        return self._n

    def __contains__(self, w: Waiter) -> bool:
        return w in self._where

    def lengths(self) -> list[int]:
        """Waiting requests per band (band order)."""
        return [len(b) for b in self.bands]

    def push(self, w: Waiter) -> None:
        """Queue ``w`` in its band (``w.band``)."""
        w.seq = next(self._seq)
        b = self.bands[w.band]
        b.fair.push(w, w.weight)
        b.order[w] = None
        self._where[w] = w.band
        heapq.heappush(self._deadlines, (w.deadline, w.seq, w))
        self._n += 1

    def pop(self, lowest: int | None = None) -> Waiter | None:
        """The next request to dispatch from bands ``0..lowest`` (all bands when None), or
        None when those bands are empty."""
        last = len(self.bands) - 1 if lowest is None else min(lowest, len(self.bands) - 1)
        for i in range(last + 1):
            b = self.bands[i]
            if b.aged:
                w = b.aged.popleft()
                b.aged_cost -= w.cost
            else:
                item = b.fair.pop()
                if item is None:
                    continue
                w = item
                del b.order[w]
            del self._where[w]
            self._n -= 1
            return w
        return None

    def remove(self, w: Waiter) -> bool:
        """Take ``w`` out (client gone, deadline); False when it is not queued."""
        i = self._where.pop(w, None)
        if i is None:
            return False
        b = self.bands[i]
        if w.promoted and w in b.aged:
            b.aged.remove(w)
            b.aged_cost -= w.cost
        else:
            b.fair.remove(w)
            b.order.pop(w, None)
        self._n -= 1
        return True

    def expired(self, now: float) -> list[Waiter]:
        """Remove and return every request whose deadline is ``<= now``."""
        out: list[Waiter] = []
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, w = heapq.heappop(self._deadlines)
            if self.remove(w):
                out.append(w)
        if len(self._deadlines) > 2 * self._n + 64:  # drop entries of dispatched requests
            self._deadlines = [e for e in self._deadlines if e[2] in self._where]
            heapq.heapify(self._deadlines)
        return out

    def promote(self, now: float) -> list[tuple[Waiter, int, int]]:
        """Move every request waiting longer than its band's ``max_wait_s`` up one band;
        ``[(waiter, from band, to band)]`` (a request may climb several bands at once)."""
        moved: list[tuple[Waiter, int, int]] = []
        for i in range(len(self.bands) - 1, 0, -1):  # bottom up: one call may climb several
            b = self.bands[i]
            limit = b.rule.max_wait_s
            if limit is None:
                continue
            while True:
                w = self._oldest(b)
                if w is None or now - w.arrived < limit:
                    break
                self.remove(w)
                w.band, w.promoted = i - 1, True
                up = self.bands[i - 1]
                up.aged.append(w)
                up.aged_cost += w.cost
                self._where[w] = i - 1
                self._n += 1
                moved.append((w, i, i - 1))
        return moved

    def oldest_arrival(self, band: int) -> float | None:
        """Arrival (s) of the oldest request waiting in ``band`` or any lower one (None)."""
        firsts = [w.arrived for b in self.bands[band:] if (w := self._oldest(b)) is not None]
        return min(firsts, default=None)

    @staticmethod
    def _oldest(b: _Band) -> Waiter | None:
        first = next(iter(b.order), None)
        aged = b.aged[0] if b.aged else None
        if first is None or (aged is not None and aged.arrived <= first.arrived):
            return aged
        return first

    def tokens_ahead(self, band: int, key: str, cost: float, weight: float) -> float:
        """Estimated tokens dispatched before a new request of ``cost`` tokens from ``key``
        (``weight``) in ``band``: everything in higher bands, the band's promoted requests,
        and of each key in the band what fluid fair sharing (GPS) would serve before it:
        ``min(queued_j, (queued_key + cost) × w_j / weight)``."""
        ahead = 0.0
        for i in range(band):
            b = self.bands[i]
            ahead += b.aged_cost + sum(c for c, _ in b.fair.queued_cost().values())
        b = self.bands[band]
        ahead += b.aged_cost
        queued = b.fair.queued_cost()
        own = queued.get(key, (0.0, weight))[0] + cost
        for other, (q, w) in queued.items():
            ahead += q if other == key else min(q, own * w / weight)
        return ahead

    def key_tokens(self, band: int, key: str) -> float:
        """Tokens ``key`` has waiting in ``band``'s fair queue."""
        return self.bands[band].fair.queued_cost().get(key, (0.0, 1.0))[0]

    def __iter__(self) -> Iterator[Waiter]:
        """Every waiting request (no particular order)."""
        return iter(list(self._where))
