"""Plan a request: the tier to try first and the ordered pools of its fallback chain. Pure.

``auto`` with live estimates is ``gateway.plan.auto`` (the handler passes its choice in). Without
one it picks the fast pool while it is lightly loaded, since speculative decoding speeds up
requests at low load and slows them down at high load (vLLM blog, "How Speculative Decoding
Boosts vLLM Performance by up to 2.8x", 2024); otherwise the standard pool.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gateway.config import Tier
from gateway.fleet.pools import Pool, PoolRegistry
from gateway.plan.tiers import TierRequest

if TYPE_CHECKING:
    from gateway.plan.auto.service import AutoChoice


@dataclass(slots=True)
class Plan:
    """``chain``: pools to try in order (first = the chosen tier, then its fallbacks, each once).
    ``reason``: why the first tier differs from what was asked (for ``auto``, the decision's
    reason: ``fast-faster``, ``fast-saturated``, ``prefix-on-standard``, ``explore``,
    ``no-fast-entitlement``... see ``gateway.plan.auto.decide``; ``tier-unavailable``), or None.
    ``route``: the request's routing keys, computed once (``gateway.routing.RouteRequest``);
    ``auto``: the live-estimate decision behind an ``auto`` plan (None: the structural rules).
    ``engine_priority``: vLLM's ``priority`` field for pools whose engines run priority
    scheduling (the request's band, 0 = highest; ``gateway.admit.admission``)."""

    request: TierRequest
    chain: list[Pool] = field(default_factory=list)
    reason: str | None = None
    route: Any = None
    auto: AutoChoice | None = None
    engine_priority: int = 0

    @property
    def asked_tier(self) -> str:
        """The tier the client asked for (standard | fast | auto)."""
        return self.request.tier


def plan_request(
    req: TierRequest,
    pools: PoolRegistry,
    allowed_tiers: frozenset[str] | None = None,
    auto: AutoChoice | None = None,
) -> Plan:
    """Choose the first tier for ``req`` and build its fallback chain of pools.

    ``allowed_tiers`` (the API key's entitlement, ``auth.check_request``; None = all) narrows
    ``auto`` and the first tier to those tiers (reason ``tier-not-entitled``) and drops every
    other tier from the fallback chain, so no fallback lands on a tier the key lacks.
    ``auto``: the live-estimate choice for an ``auto`` request (``gateway.plan.auto.service``);
    without one, ``auto`` follows the load threshold below."""
    model = req.model
    reason: str | None = None
    first: Tier
    if req.tier == "auto":
        if allowed_tiers is not None and "fast" not in allowed_tiers:
            first, reason = "standard", "no-fast-entitlement"
        elif auto is not None:
            first, reason = auto.tier, auto.reason
        else:
            first, reason = _choose_auto(req, pools)
    elif req.tier in model.tiers:
        first = req.tier
    else:
        first = "standard" if "standard" in model.tiers else next(iter(model.tiers))
        reason = "tier-unavailable"
    if allowed_tiers is not None and first not in allowed_tiers:
        first = next((t for t in model.tiers if t in allowed_tiers), first)
        reason = reason if req.tier == "auto" else "tier-not-entitled"
    chain: list[Pool] = []
    for tier in model.fallback_chain(first):
        if allowed_tiers is not None and tier not in allowed_tiers:
            continue
        pool = pools.get(req.model_name, tier)
        if pool is not None:
            chain.append(pool)
    return Plan(req, chain, reason, auto=auto if req.tier == "auto" else None)


def _choose_auto(req: TierRequest, pools: PoolRegistry) -> tuple[Tier, str]:
    model = req.model
    if "fast" not in model.tiers:
        return ("standard", "no-fast-pool")
    if "standard" not in model.tiers:
        return ("fast", "no-standard-pool")
    fast = pools.get(req.model_name, "fast")
    assert fast is not None
    usable = fast.usable(time.monotonic())
    if not usable:
        return ("standard", "fast-unavailable")
    mean_inflight = sum(r.inflight for r in usable) / len(usable)
    if mean_inflight < model.auto_fast_max_inflight_per_replica:
        return ("fast", "fast-idle")
    return ("standard", "fast-saturated")
