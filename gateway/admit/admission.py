"""Admission under load, after the gate: what the handler calls, in this order.

1. ``enter(key, treq, allowed, request, body, rec)`` after the rate limits: the
   request's priority band (``flow.bands``; 400/403 for a bad ``x-speedgate-priority``) and its
   session budget (``budget``; 429 ``session_budget_exceeded``) → a ``Ticket``. Its
   ``over_soft_budget`` steers ``auto`` to the cheaper tier, its ``engine_priority`` goes to
   pools whose engines run vLLM's priority scheduling, its ``headers()`` go on the response;
2. ``wait(ticket, plan, timeout_s, rec)`` inside the disconnect watch, before the first attempt: a
   slot on the plan's first pool, queued while that pool is saturated (``flow.flow_control``; 503,
   or 429 for flex, when it cannot start in time); returns the request timeout left;
3. ``leave(ticket, rec)`` exactly once after accounting, on every exit path: the slot back
   (the next waiting request goes at once) and the session's reservation settled at the
   request's cost.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.admit.auth import load_keys
from gateway.admit.budget import BudgetHold, SessionBudgets, estimate_usd
from gateway.admit.budget_redis import RedisBudgetLedger
from gateway.admit.flow.bands import HEADER as PRIORITY_HEADER
from gateway.admit.flow.flow_control import (
    BYTES_PER_TOKEN,
    Admission,
    FlowControl,
    QueueRefused,
    Slot,
)
from gateway.config import ConfigError, GatewayConfig, check_key_bands
from gateway.upstream.deadline import total_timeout_s

if TYPE_CHECKING:
    from gateway.admit.auth import ApiKey
    from gateway.admit.request import ClientRequest
    from gateway.fleet.pools import PoolRegistry
    from gateway.plan.chain import Plan
    from gateway.plan.tiers import TierRequest
    from gateway.protocols.body import ParsedBody
    from gateway.telemetry.record import RequestRecord


@dataclass(slots=True, eq=False)
class Ticket:
    """One request's admission state: its band (``admission``), session budget ``hold`` and,
    once ``wait`` returned, its pool ``slot``."""

    admission: Admission
    hold: BudgetHold | None = None
    slot: Slot | None = field(default=None)

    @property
    def over_soft_budget(self) -> bool:
        """The session is past its budget's soft share: ``auto`` takes the cheaper tier."""
        return self.hold is not None and self.hold.soft

    @property
    def engine_priority(self) -> int:
        """vLLM's ``priority`` field for this request: its band's position (0 = highest)."""
        return self.admission.band.index

    def headers(self) -> list[tuple[bytes, bytes]]:
        """Response headers: ``x-speedgate-priority`` (the band) and, with a budget, the
        session's budget and remaining budget."""
        out = [(PRIORITY_HEADER.encode(), self.admission.band.name.encode())]
        return out + (self.hold.headers() if self.hold is not None else [])


class AdmissionControl:
    """Flow control and session budgets of one gateway process."""

    def __init__(self, flow: FlowControl, budgets: SessionBudgets) -> None:
        self.flow = flow
        self.budgets = budgets

    async def enter(
        self,
        key: ApiKey | None,
        treq: TierRequest,
        allowed: frozenset[str] | None,
        request: ClientRequest,
        body: ParsedBody,
        rec: RequestRecord,
    ) -> Ticket:
        """Band and session budget of one request (see the module docstring): its band from
        ``request.priority``, its budget hold from ``request.budget``."""
        cfg = key.config if key is not None else None
        raw_size = request.size
        adm = self.flow.classify(cfg, request.priority, body.doc, raw_size, rec.session_id)
        rec.band, rec.flex = adm.band.name, adm.flex
        ticket = Ticket(adm)
        output = adm.cost - raw_size / BYTES_PER_TOKEN
        prices = [p.prices for t, p in treq.model.tiers.items() if allowed is None or t in allowed]
        ticket.hold = await self.budgets.reserve(
            cfg, rec.session_id, request.budget, treq.model_name,
            estimate_usd(raw_size / BYTES_PER_TOKEN, output, prices), rec.request_id,
            ancestors=[s for s in (rec.parent_session_id, rec.root_session_id) if s])
        return ticket

    async def wait(
        self, ticket: Ticket, plan: Plan, timeout_s: float | None, rec: RequestRecord
    ) -> float | None:
        """Take a slot on the plan's first pool, waiting in its queue while it is saturated:
        at most the band's ``max_queue_s``, the pool's ``ttft_s``, and the request's own total
        timeout less the time a request of its band typically holds a slot (a request that
        would be cut off by its deadline mid-answer is better refused before it runs).
        Returns ``timeout_s`` less the time waited (``rec.queue_wait_s``). Raises
        ``QueueRefused`` carrying ``decision_s``, the seconds since the request reached the
        gateway (``rec.t_start``, monotonic)."""
        if not plan.chain:
            return timeout_s
        pool = plan.chain[0]
        t = pool.config.timeouts
        band = self.flow.config.flow_control.bands[ticket.admission.band.index]
        index = ticket.admission.band.index
        left = total_timeout_s(t.total_s, timeout_s) - self.flow.service_s(pool, index)
        budget_s = max(0.0, min(band.max_queue_s, t.ttft_s, left))
        try:
            ticket.slot = slot = await self.flow.acquire(pool, ticket.admission, budget_s)
        except QueueRefused as e:  # arrival → decision, on the response and in the metrics
            e.decision_s = time.monotonic() - rec.t_start
            self.flow.observe_refusal(pool, ticket.admission.band.name, e.reason, e.decision_s)
            raise
        if slot is None:
            return timeout_s
        rec.queue_wait_s = slot.waited_s if slot.queued else None
        return slot.remaining_s(timeout_s)

    async def leave(self, ticket: Ticket | None, rec: RequestRecord) -> None:
        """Release the slot (the fair queue learns the actual tokens) and settle the budget
        at ``rec.cost_usd``. Idempotent."""
        if ticket is None:
            return
        if ticket.slot is not None:
            u = rec.usage if rec.served_tier else None
            self.flow.release(ticket.slot, u.prompt + u.completion if u is not None else None,
                              rec.ttft_s)
        await self.budgets.settle(ticket.hold, rec.cost_usd or 0.0)

    async def close(self) -> None:
        """Refuse requests still queued, stop the pumps, flush budget settles."""
        await self.flow.close()
        await self.budgets.close()


def build_admission(config: GatewayConfig, pools: PoolRegistry) -> AdmissionControl:
    """Flow control and session budgets (ledgers in Redis with ``state.redis_url``). Raises
    ``ConfigError`` when a key of ``auth.keys_file`` names an unknown band."""
    try:
        check_key_bands(config.flow_control, load_keys(config.auth), "auth keys")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    b, st = config.budgets, config.state
    ledger = (
        RedisBudgetLedger.from_url(st.redis_url, st.redis_timeout_s, prefix=b.redis_prefix,
                             reservation_ttl_s=b.reservation_ttl_s,
                             session_ttl_s=b.session_ttl_s)
        if st.redis_url else None
    )
    return AdmissionControl(FlowControl(config, pools), SessionBudgets(config, ledger))
