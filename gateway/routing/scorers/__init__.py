"""Scorers: each rates every candidate in [0, 1] (higher = better); the picker sums them with
the pool's configured weights (``RoutingConfig.weights``). One file per scorer; a new routing
idea is a new scorer registered in ``SCORERS``."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gateway.fleet.pools import Replica
from gateway.routing.scorers.base import ScoreContext
from gateway.routing.scorers.hash import score_hash
from gateway.routing.scorers.headroom import score_headroom
from gateway.routing.scorers.load import score_load
from gateway.routing.scorers.prefix import score_prefix
from gateway.routing.scorers.session import score_session

Scorer = Callable[[ScoreContext, Sequence[Replica]], list[float]]

SCORERS: dict[str, Scorer] = {
    "prefix": score_prefix,
    "session": score_session,
    "load": score_load,
    "hash": score_hash,
    "headroom": score_headroom,
}

__all__ = ["SCORERS", "ScoreContext", "Scorer"]
