"""The console's live windows, fed once per finished request from the accounting step.

``ConsoleRecorder.observe(rec)`` (``gateway.account``) files one request, in O(1)
and without any text of it, into rings of ``step_s`` buckets covering ``window_s`` seconds
(``gateway.console.window``):

- per pool (``model/tier``): requests by outcome class, TTFT (s) and output tokens/s per
  request sketches, tokens, cost (USD); requests that no pool served are filed under the last
  tier they tried (or asked for);
- per model: ``auto`` decisions by reason (requests that asked for ``auto``);
- the whole gateway: requests by outcome class (unauthenticated and malformed ones too);
- retries, fallbacks and timeouts by kind, tier and reason (``gateway.console.incidents``),
  and the last ``recent_events`` requests that had any, one by one;
- sessions (``x-session-id``): a bounded LRU table (``gateway.console.sessions``).

Memory is bounded by the configured pools × ``window_s / step_s`` buckets (each a few counters
and two sketches of at most a few hundred entries), ``recent_events`` rows and
``max_sessions`` sessions, whatever the traffic. Times are monotonic seconds from ``clock``
(injected in tests); readers convert to unix time.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.config import ConsoleConfig
from gateway.console.incidents import Incident, incidents_of
from gateway.console.sessions import SessionTable, clip_id
from gateway.console.window import PoolStep, StepRing, outcome_class
from gateway.telemetry.record import RequestRecord

TIERS = ("standard", "fast")


@dataclass(frozen=True, slots=True)
class IncidentRow:
    """One request that had retries, fallbacks or timeouts (ids only, never text)."""

    t: float  # monotonic s
    request_id: str
    model: str | None
    asked_tier: str | None
    served_tier: str | None
    status: int
    outcome: str | None
    key_id: str | None
    session_id: str | None
    incidents: tuple[Incident, ...]


class ConsoleRecorder:
    """Bounded live windows of request outcomes, latency, speed, cost and incidents."""

    def __init__(
        self,
        config: ConsoleConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = cfg = config or ConsoleConfig()
        self.clock = clock
        self.window_s = cfg.window_s
        self.step_s = cfg.step_s
        self.started = clock()
        self.pools: dict[str, StepRing[PoolStep]] = {}
        self.auto: dict[str, StepRing[Counter[str]]] = {}
        self.gateway: StepRing[Counter[str]] = self._ring(Counter)
        self.incidents: StepRing[Counter[tuple[str, str, str]]] = self._ring(Counter)
        self.recent: deque[IncidentRow] = deque(maxlen=cfg.recent_events)
        self.sessions = SessionTable(cfg.max_sessions)
        self.observed = 0
        #: KV capacity since start: ``refused`` (context_length_exceeded: fits no replica),
        #: ``tier_dropped`` (context-does-not-fit: served by a later tier), ``move``, ``wait``
        self.kv: Counter[str] = Counter()

    def _ring(self, factory: Callable[[], Any]) -> StepRing[Any]:
        return StepRing(self.window_s, self.step_s, factory)

    # -- writing (the request path, once per request) ---------------------------------------
    def observe(self, rec: RequestRecord) -> None:
        """File one finished request (after usage and cost are known)."""
        now = self.clock()
        self.observed += 1
        cls = outcome_class(rec.status, rec.outcome)
        g = self.gateway.at(now)
        if g is not None:
            g[cls] += 1
        found = incidents_of(rec)
        if rec.outcome == "context_length_exceeded":
            self.kv["refused"] += 1
        if rec.fallback and "context-does-not-fit" in rec.fallback:
            self.kv["tier_dropped"] += 1
        if rec.kv_placement in ("move", "wait"):
            self.kv[rec.kv_placement] += 1
        model = rec.model
        if model is None:
            return
        tier = rec.served_tier or next(
            (i.tier for i in reversed(found) if i.tier in TIERS),
            rec.asked_tier if rec.asked_tier in TIERS else None,
        )
        if tier is not None:
            self._observe_pool(f"{model}/{tier}", rec, cls, now)
        if rec.asked_tier == "auto" and rec.auto_reason:
            ring = self.auto.get(model)
            if ring is None:
                ring = self.auto[model] = self._ring(Counter)
            bucket = ring.at(now)
            if bucket is not None:
                bucket[f"{rec.served_tier or '-'}:{rec.auto_reason}"] += 1
        if found:
            ib = self.incidents.at(now)
            if ib is not None:
                for inc in found:
                    ib[(inc.kind, inc.where, inc.reason)] += 1
            self.recent.append(IncidentRow(
                now, rec.request_id, model, rec.asked_tier, rec.served_tier, rec.status,
                rec.outcome, rec.key_id, clip_id(rec.session_id), tuple(found),
            ))
        if rec.session_id:
            u = rec.usage if rec.served_tier else None
            self.sessions.observe(
                rec.key_id, rec.session_id, now, tier=rec.served_tier, ok=cls == "ok",
                prompt=u.prompt if u else 0, cached=u.cached if u else 0,
                completion=u.completion if u else 0, cost_usd=rec.cost_usd or 0.0,
                parent=rec.parent_session_id,
            )

    def session_ended(self, key_id: str | None, session_id: str, how: str) -> None:
        """A session ended ``how`` (``explicit`` or ``idle``): its row says so."""
        self.sessions.end(key_id, session_id, how)

    def _observe_pool(self, key: str, rec: RequestRecord, cls: str, now: float) -> None:
        ring = self.pools.get(key)
        if ring is None:
            ring = self.pools[key] = self._ring(PoolStep)
        step = ring.at(now)
        if step is None:
            return
        step.add_outcome(cls)
        if not rec.served_tier:
            return
        if rec.stream and rec.ttft_s is not None:
            step.ttft.add(rec.ttft_s)
        u = rec.usage
        if u is not None:
            step.with_usage += 1
            step.prompt_tokens += u.prompt
            step.cached_tokens += min(u.cached, u.prompt)
            step.completion_tokens += u.completion
            itl = rec.itl
            if (cls == "ok" and rec.stream and u.completion > 1 and itl is not None
                    and itl.n and itl.span_s > 0):
                step.tps.add((u.completion - 1) / itl.span_s)
        if rec.cost_usd:
            step.cost_usd += rec.cost_usd

    # -- reading (the console's state endpoint) ---------------------------------------------
    def covered_s(self, now: float, steps: int | None = None) -> float:
        """Seconds the last ``steps`` buckets really cover at ``now``: the whole steps before
        the current one plus its elapsed part, but never before the recorder started."""
        ring = self.gateway
        k = ring.n if steps is None else max(1, min(ring.n, steps))
        start = (ring.epoch(now) - k + 1) * self.step_s
        return max(1e-9, now - max(start, self.started))

    def steps_for(self, window_s: float | None) -> int:
        """Buckets that make up ``window_s`` seconds (the whole ring when None)."""
        n = self.gateway.n
        if window_s is None:
            return n
        return max(1, min(n, round(window_s / self.step_s)))

    def pool_window(self, key: str, now: float, steps: int | None = None) -> PoolStep:
        """The pool's last ``steps`` buckets merged into one (empty when never seen)."""
        out = PoolStep()
        ring = self.pools.get(key)
        if ring is not None:
            for b in ring.buckets(now, steps):
                out.merge(b)
        return out

    def pool_series(self, key: str, now: float) -> list[tuple[int, PoolStep | None]]:
        """Every bucket of the pool's ring, oldest first (``None``: nothing that step)."""
        ring = self.pools.get(key)
        if ring is None:
            return [(e, None) for e, _ in self.gateway.window(now)]
        return ring.window(now)

    def auto_reasons(self, model: str, now: float, steps: int | None = None) -> Counter[str]:
        """``served-tier:reason`` → auto decisions of ``model`` in the window."""
        out: Counter[str] = Counter()
        ring = self.auto.get(model)
        if ring is not None:
            for b in ring.buckets(now, steps):
                out.update(b)
        return out

    def auto_series(self, model: str, now: float) -> list[tuple[int, Counter[str] | None]]:
        """Every step of ``model``'s auto decisions ring, oldest first (None: no decision)."""
        ring = self.auto.get(model)
        if ring is None:
            return [(e, None) for e, _ in self.gateway.window(now)]
        return ring.window(now)

    def outcome_counts(self, now: float, steps: int | None = None) -> Counter[str]:
        """Requests of the whole gateway by outcome class in the window."""
        out: Counter[str] = Counter()
        for b in self.gateway.buckets(now, steps):
            out.update(b)
        return out

    def incident_counts(
        self, now: float, steps: int | None = None
    ) -> Counter[tuple[str, str, str]]:
        """``(kind, tier, reason)`` → incidents in the window."""
        out: Counter[tuple[str, str, str]] = Counter()
        for b in self.incidents.buckets(now, steps):
            out.update(b)
        return out
