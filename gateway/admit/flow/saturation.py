"""When a pool is saturated, per band: its slots are taken, or its engines' own queues are past
the configured bound. Pure functions of the pool's state and ``now`` (monotonic s).

Slots: ``max_inflight_per_replica`` × replicas that are healthy and not ejected. A band may use
the slots minus the part of the higher bands' reservations (``reserved_share``, rounded to the
nearest slot, never all of them) that those bands do not hold now, so the top band usually
finds a free slot and a reservation in use costs the lower bands nothing. Engine queues: the scraped
``vllm:num_requests_waiting`` of replicas scraped within ``fresh_s``, plus the requests this
gateway sent since the newest scrape, minus those that finished since (each frees a running
slot that a waiting request takes); saturated when that exceeds ``max_engine_waiting`` per
replica. A pool with neither bound is never saturated and never queues.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gateway.fleet.pools import Pool


def band_limits(
    capacity: int, reserved_shares: Sequence[float], held: Sequence[int] | None = None
) -> list[int]:
    """Slots in use (all bands together) below which each band may take one more, band 0
    first: ``capacity`` minus the unused reservations of the bands above, ``Σ_j max(0, r_j −
    held_j)`` where band j reserves ``r_j = round(capacity × Σ shares up to j) − round(capacity
    × Σ shares before j)`` slots (halves up); at least 1 while ``capacity`` is positive.
    ``held``: slots each band holds now (None: none).

    Nearest, not up: a reservation costs the lower bands its slots whenever its band is idle,
    so it should be the fair fraction the share asks for, within half a slot. Rounding up made
    the default 10% reserve 1 of 2 slots (50%: two standard requests on 2 replicas × 1 slot
    ran one after the other beside an idle replica); a share under half a slot reserves none.

    A reservation is kept free *for* its band, not on top of what that band already holds: a
    top-band request running in a reserved slot uses the reservation, so the lower bands may
    fill every other slot (work-conserving: the only idle slots are the unused part of a
    reservation); a band holding more than its reservation frees nothing of another's."""
    out: list[int] = []
    cum = 0.0
    unused = 0
    for i, share in enumerate(reserved_shares):
        out.append(max(min(capacity, 1), capacity - unused))
        mine = _nearest(capacity * (cum + share)) - _nearest(capacity * cum)
        cum += share
        unused += max(0, mine - (held[i] if held is not None and i < len(held) else 0))
    return out


def _nearest(slots: float) -> int:
    """``slots`` rounded to the nearest integer, halves up (1e-9 absorbs float sums such as
    0.1 + 0.2)."""
    return math.floor(slots + 0.5 + 1e-9)


def slot_capacity(pool: Pool, now: float) -> int | None:
    """Slots of ``pool`` (None when it has no ``max_inflight_per_replica``)."""
    cap = pool.config.max_inflight_per_replica
    if not cap:
        return None
    live = sum(1 for r in pool.replicas if r.healthy and not r.outlier.is_ejected(now))
    return cap * live


class EngineQueues:
    """The engines' waiting requests as this gateway can best tell between scrapes."""

    def __init__(self, fresh_s: float = 3.0) -> None:
        self.fresh_s = fresh_s
        self.sent = 0  # requests dispatched since the newest scrape seen
        self.finished = 0
        self._scrape_at = 0.0

    def waiting(self, pool: Pool, now: float) -> tuple[float, int] | None:
        """``(estimated waiting requests, replicas counted)`` over replicas scraped within
        ``fresh_s``; None when none is."""
        fresh = [r for r in pool.replicas
                 if r.engine_load_at and now - r.engine_load_at <= self.fresh_s
                 and r.healthy and not r.outlier.is_ejected(now)]
        if not fresh:
            return None
        newest = max(r.engine_load_at for r in fresh)
        if newest > self._scrape_at:
            self._scrape_at, self.sent, self.finished = newest, 0, 0
        scraped = sum(r.engine_waiting for r in fresh)
        return max(0.0, scraped + self.sent - self.finished), len(fresh)

    def saturated(self, pool: Pool, now: float) -> bool:
        """True when the estimate exceeds ``max_engine_waiting`` × fresh replicas."""
        bound = pool.config.max_engine_waiting
        if bound is None:
            return False
        w = self.waiting(pool, now)
        return w is not None and w[0] > bound * w[1]
