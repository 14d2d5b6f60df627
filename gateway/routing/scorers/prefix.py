"""Prefix-cache affinity: the share of this request's prefix blocks a replica last served.

vLLM reuses the longest cached prefix, so a replica that served a request whose blocks 0..k-1
this one repeats saves prefilling them: score = (k − lead) / (blocks − lead) (1.0 = everything
but the new blocks is probably cached there; 0 = nothing known). ``lead`` is the preamble
before the first user message: a system prompt that many sessions share is soon cached on every
replica, and counting it would pile new sessions onto whichever replica served one last.
From the state store's block table.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.fleet.pools import Replica
from gateway.routing.scorers.base import ScoreContext


def score_prefix(ctx: ScoreContext, candidates: Sequence[Replica]) -> list[float]:
    """``(depth(replica) − lead) / (blocks − lead)`` per candidate, in [0, 1]."""
    lead = ctx.lead_blocks
    if ctx.lookup is None or ctx.blocks <= lead:
        return [0.0] * len(candidates)
    depth = ctx.lookup.depth
    span = ctx.blocks - lead
    return [min(1.0, max(0, depth.get(r.name, 0) - lead) / span) for r in candidates]
