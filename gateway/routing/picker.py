"""Pickers: the best weighted score (random tie-break), or round robin (a baseline). Pure."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from gateway.fleet.pools import Replica
from gateway.routing.scorers import SCORERS, ScoreContext


def weighted_scores(
    ctx: ScoreContext, candidates: Sequence[Replica], weights: Mapping[str, float]
) -> list[float]:
    """Σ weight × score over the configured scorers, per candidate."""
    total = [0.0] * len(candidates)
    for name, w in weights.items():
        if w:
            for i, s in enumerate(SCORERS[name](ctx, candidates)):
                total[i] += w * s
    return total


def pick_best(
    candidates: Sequence[Replica], scores: Sequence[float], rng: random.Random | None = None
) -> Replica | None:
    """The candidate with the highest score (within 1e-9), ties broken at random."""
    if not candidates:
        return None
    top = max(scores)
    best = [r for r, s in zip(candidates, scores, strict=True) if s >= top - 1e-9]
    return best[0] if len(best) == 1 else (rng or random).choice(best)


class RoundRobin:
    """Cycles through the pool's replicas, skipping ones that are not candidates."""

    def __init__(self) -> None:
        self._next = 0

    def pick(self, pool: Sequence[Replica], candidates: Sequence[Replica]) -> Replica | None:
        """The next replica of ``pool`` (in config order) that is in ``candidates``."""
        if not candidates:
            return None
        allowed = set(candidates)
        n = len(pool)
        for _ in range(n):
            r = pool[self._next % n]
            self._next += 1
            if r in allowed:
                return r
        return candidates[0]
