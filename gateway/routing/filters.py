"""Filters: which replicas may take this request. Pure.

Health, ejection and the in-flight cap are ``Pool.usable``; here: not tried yet by this request
(every retry goes to a different replica), the bounded-load rule (``load_bound``/``under_bound``,
over any load: active sessions when a session is bound, requests for stateless policies),
``overloaded``: replicas clearly past their share of requests, and ``over_share``: a replica
holding more than its share of active sessions while another has room (sessions bound during
an outage); the two reasons a bound session leaves its replica (``pipeline``).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

from gateway.fleet.pools import Replica


def not_tried(candidates: Sequence[Replica], exclude: Collection[Replica]) -> list[Replica]:
    """Candidates not in ``exclude`` (replicas this request already tried)."""
    return [r for r in candidates if r not in exclude]


def load_bound(loads: Sequence[int], c: float, floor: int = 1) -> float:
    """The most requests one replica may hold after taking one more: ``ceil(c × (total + 1) /
    n)`` (consistent hashing with bounded loads: Mirrokni, Thorup, Zadimoghaddam, SODA 2018,
    "Consistent Hashing with Bounded Loads"), at least ``floor``. ``c <= 0``: no bound."""
    if c <= 0 or not loads:
        return math.inf
    return max(floor, math.ceil(c * (sum(loads) + 1) / len(loads)))


def under_bound(
    candidates: Sequence[Replica], loads: Mapping[Replica, int], c: float, floor: int = 1
) -> list[Replica]:
    """Candidates that stay within the bound after taking this request (load + 1 ≤ bound).
    Never empty when ``candidates`` is not: the least loaded always qualifies for c ≥ 1."""
    bound = load_bound([loads[r] for r in candidates], c, floor)
    kept = [r for r in candidates if loads[r] + 1 <= bound]
    return kept or list(candidates)


def overloaded(
    candidates: Sequence[Replica], loads: Mapping[Replica, int], c: float, floor: int
) -> set[Replica]:
    """Candidates whose request load (``replica_load``) is over ``max(floor, c × mean)``:
    a queue, not a burst. An engine batches hundreds of sequences, so a few more requests cost
    a bound session far less than prefilling its whole conversation again elsewhere; only a
    replica this far past its share (slowed down, or handed a flood) is worth leaving.
    ``c <= 0``: never."""
    if c <= 0 or not candidates:
        return set()
    limit = max(floor, c * sum(loads[r] for r in candidates) / len(candidates))
    return {r for r in candidates if loads[r] > limit}


def session_share(total: int, n: int, c: float) -> int:
    """The most active sessions one of ``n`` replicas holds before it sheds some, of ``total``:
    ``max(ceil(total / n) + 1, floor(c × total / n))``. With c = 1.25 a pool can settle at
    max/mean ≤ c (the bounded-load guarantee, Mirrokni et al. 2018, without its rounding up);
    the ``+ 1`` keeps the balance that binding under the bound leaves (within one session of
    the mean) from ever moving a session."""
    if n <= 0:
        return total
    return max(math.ceil(total / n) + 1, math.floor(c * total / n))


def over_share(held: int, total: int, others: Sequence[int], c: float) -> int:
    """How many of its ``held`` active sessions a replica should shed: those over its
    ``session_share`` of ``total`` (sessions active on the pool, among ``1 + len(others)``
    candidates), when at least one other candidate (active sessions in ``others``) has room
    under the share; else 0. ``c <= 0``: never (no bound)."""
    if c <= 0 or not others:
        return 0
    share = session_share(total, len(others) + 1, c)
    if held <= share or not any(o + 1 <= share for o in others):
        return 0
    return held - share
