"""When a pool is saturated, per band: its slots are taken, or its engines' own queues are past
the configured bound. Pure functions of the pool's state and ``now`` (monotonic s).

Slots: ``max_inflight_per_replica`` × replicas that are healthy and not ejected. A band may use
the slots minus those reserved for the bands above it (``reserved_share``, rounded up, never
all of them), so the top band usually finds a free slot. Engine queues: the scraped
``vllm:num_requests_waiting`` of replicas scraped within ``fresh_s``, plus the requests this
gateway sent since the newest scrape, minus those that finished since (each frees a running
slot that a waiting request takes); saturated when that exceeds ``max_engine_waiting`` per
replica. A pool with neither bound is never saturated and never queues.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gateway.routing.pools import Pool


def band_limits(capacity: int, reserved_shares: Sequence[float]) -> list[int]:
    """Slots each band may fill, band 0 first: ``capacity`` minus ``ceil(capacity × sum of the
    reserved shares of the bands above)``, at least 1 while ``capacity`` is positive."""
    out: list[int] = []
    above = 0.0
    for share in reserved_shares:
        held = math.ceil(capacity * above - 1e-9)
        out.append(max(min(capacity, 1), capacity - held))
        above += share
    return out


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
