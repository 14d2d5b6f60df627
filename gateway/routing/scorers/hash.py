"""Consistent-hash order: 1 for the session's home replica, falling linearly along its
rendezvous order (``hashring``) to 0 for the last. Alone (``weights: {hash: 1}``) it is
session-hash routing (production-stack's session router); with affinity it breaks ties the same
way on every gateway replica and makes a spilled session go to the next replica in its order.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.fleet.pools import Replica
from gateway.routing.scorers.base import ScoreContext


def score_hash(ctx: ScoreContext, candidates: Sequence[Replica]) -> list[float]:
    """``1 − rank / (n − 1)`` in the session's order of the whole pool (n replicas)."""
    n = len(ctx.order)
    if n <= 1:
        return [1.0] * len(candidates)
    rank = {r: i for i, r in enumerate(ctx.order)}
    return [1.0 - rank.get(r, n - 1) / (n - 1) for r in candidates]
