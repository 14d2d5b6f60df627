"""Load: prefer replicas with less load and free KV cache.

Stateless policies (``ctx.sessions`` None): score = 0.8 × (1 − load / (max load + 1)) + 0.2 ×
(1 − KV-cache usage): 1.0 for an idle replica with an empty cache, falling linearly with its
share of the busiest candidate's requests (``fleet.pools.replica_load``: in-flight here or the
engine's running + waiting) and with ``vllm:kv_cache_usage_perc``.

Binding a session (``ctx.sessions``: active sessions per candidate): the load is the sessions a
replica holds, which are its load for the rest of their conversations, with the requests in
flight (a snapshot between think times) only breaking ties: ``sessions + requests / (max
requests + 1)``; and it is scored against the candidates' spread, ``1 − (load − min) / max(max −
min, 1)``, so a difference of one session weighs the same at 2 sessions a replica as at 200; a new
session goes to the emptiest replica (oracle-like balance, well inside the ``c`` bound).
Relative either way, so the scale of load never swamps affinity weights.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.fleet.pools import Replica
from gateway.routing.scorers.base import ScoreContext


def score_load(ctx: ScoreContext, candidates: Sequence[Replica]) -> list[float]:
    """Per candidate, in [0, 1]."""
    kv = [0.2 * (1 - min(1.0, max(0.0, r.kv_cache_usage))) for r in candidates]
    requests = [ctx.loads.get(r, r.inflight) for r in candidates]
    top = max(requests, default=0) + 1
    if ctx.sessions is None:
        return [0.8 * (1 - x / top) + k for x, k in zip(requests, kv, strict=True)]
    loads = [ctx.sessions.get(r, 0) + x / top for r, x in zip(candidates, requests, strict=True)]
    low = min(loads, default=0.0)
    spread = max(max(loads, default=0.0) - low, 1.0)
    return [0.8 * (1 - (x - low) / spread) + k for x, k in zip(loads, kv, strict=True)]
