"""Replica choice within a pool (foundation policy): fewest in-flight requests at this gateway,
random tie-break. Pure: replicas in, replica out."""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence

from gateway.fleet.pools import Replica


def pick_least_inflight(
    candidates: Sequence[Replica],
    exclude: Collection[Replica] = (),
    rng: random.Random | None = None,
) -> Replica | None:
    """The candidate with the fewest in-flight requests, ties broken at random; None if empty.

    ``exclude`` holds replicas already tried for this request (never tried twice).
    """
    best: list[Replica] = []
    low = None
    for r in candidates:
        if r in exclude:
            continue
        if low is None or r.inflight < low:
            low = r.inflight
            best = [r]
        elif r.inflight == low:
            best.append(r)
    if not best:
        return None
    if len(best) == 1:
        return best[0]
    return (rng or random).choice(best)
