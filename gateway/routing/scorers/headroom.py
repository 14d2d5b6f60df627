"""Headroom: prefer replicas whose free KV cache holds this request without preemption.

vLLM V1 preempts the newest running request by recompute when a step needs blocks the pool
no longer has (its prefill is redone later), so placing a long request where it does not fit
the free KV slows every request there. With ``free = fit.free_kv_tokens`` (capacity − the larger
of the engine's in-use share and this gateway's open attempts' prompt + output caps) and
``need`` the request's tokens: score 1.0 when ``need ≤ free``, else ``0.5 × free / need`` (the
less is missing, the better); 1.0 for every candidate when ``need`` or the capacity is
unknown, so the scorer is neutral until the engine reported its pool.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.fleet.pools import Replica
from gateway.routing.fit import free_kv_tokens
from gateway.routing.scorers.base import ScoreContext


def score_headroom(ctx: ScoreContext, candidates: Sequence[Replica]) -> list[float]:
    """Per candidate, in [0, 1]."""
    if ctx.tokens <= 0:
        return [1.0] * len(candidates)
    out = []
    for r in candidates:
        free, need = free_kv_tokens(r, ctx.now), ctx.need(r)
        out.append(1.0 if free is None or need <= free else 0.5 * free / need)
    return out
