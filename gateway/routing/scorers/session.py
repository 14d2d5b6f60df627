"""Session stickiness: 1 for the replica the session was last routed to, else 0.

Catches what prefix blocks miss: a conversation whose history was rewritten (summarised,
truncated) keeps its replica, where a warm cache of its system prompt and tools remains.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.fleet.pools import Replica
from gateway.routing.scorers.base import ScoreContext


def score_session(ctx: ScoreContext, candidates: Sequence[Replica]) -> list[float]:
    """1.0 for the session's bound replica, 0.0 for the others."""
    bound = ctx.lookup.session if ctx.lookup is not None else None
    return [1.0 if r.name == bound else 0.0 for r in candidates]
