"""Load: prefer replicas with fewer requests and free KV cache.

score = 0.8 × (1 − load / (max load + 1)) + 0.2 × (1 − KV-cache usage): 1.0 for an idle replica
with an empty cache, falling linearly with its share of the busiest candidate's requests
(``load.replica_load``: in-flight here or the engine's running + waiting) and with
``vllm:kv_cache_usage_perc``. Relative, so the scale of load never swamps affinity weights.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.pools import Replica
from gateway.routing.scorers.base import ScoreContext


def score_load(ctx: ScoreContext, candidates: Sequence[Replica]) -> list[float]:
    """Per candidate, in [0, 1]."""
    loads = [ctx.loads.get(r, r.inflight) for r in candidates]
    top = max(loads, default=0) + 1
    return [
        0.8 * (1 - load / top) + 0.2 * (1 - min(1.0, max(0.0, r.kv_cache_usage)))
        for r, load in zip(candidates, loads, strict=True)
    ]
