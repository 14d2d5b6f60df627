"""The ``auto`` tier's live state in one gateway process: one ``PoolEstimator`` per pool, the
session → tier table (hysteresis), the seeded exploration RNG, the decision counters, and a
scraper of the fast pools' speculative-decoding counters.

``choose`` (the request path, before ``plan_request``) gathers one request's facts — prompt
tokens estimated as characters / 4 (OpenAI's rule of thumb for English; no tokenizer on the hot
path), the prefix each pool holds for the session (the routing state store's block bindings,
``gateway.routing``: the same lookup the pool's router then reuses, so no extra round trip on
the pool that serves), ``max_tokens`` — and calls the pure rule ``gateway.plan.auto.decide``.
``observe`` (``gateway.account``, once per finished request of any tier) feeds the
pool's estimator with what the gateway measured: TTFT, decode time, tokens, and the pool's load.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.common.tasks import cancel_and_wait
from gateway.config import Tier
from gateway.fleet.pools import replica_load
from gateway.plan.auto.decide import AutoParams, PoolView, RequestFacts, TierDecision, decide
from gateway.plan.auto.estimator import Measurement, PoolEstimator, expected_output_tokens
from gateway.routing.keys import RouteRequest, sampled_indices
from gateway.routing.table import AffinityTable

if TYPE_CHECKING:
    from gateway.config import AutoConfig, GatewayConfig
    from gateway.fleet.pools import Pool, PoolRegistry
    from gateway.plan.tiers import TierRequest
    from gateway.telemetry.record import RequestRecord

log = logging.getLogger("speedgate.auto")

#: Characters per token for the prompt estimate (OpenAI: "~4 characters of English text").
CHARS_PER_TOKEN = 4.0


@dataclass(slots=True)
class AutoChoice:
    """What ``choose`` decided for one request (kept on the request record so ``observe`` can
    compare the estimate with the measurement)."""

    decision: TierDecision
    pool_key: str

    @property
    def tier(self) -> Tier:
        return "fast" if self.decision.tier == "fast" else "standard"

    @property
    def reason(self) -> str:
        return self.decision.reason

    @property
    def expected_s(self) -> float | None:
        """Expected upstream seconds on the chosen pool (None: not estimated)."""
        return self.decision.expected_s.get(self.decision.tier)


def pool_load(pool: Pool, now: float) -> float:
    """Mean requests per usable replica (``replica_load``), 0 for an empty pool."""
    usable = pool.usable(now)
    if not usable:
        return 0.0
    return sum(replica_load(r, now) for r in usable) / len(usable)


def block_end_chars(texts: list[str], chunk_chars: int, depth: int) -> int:
    """Characters covered by the first ``depth`` prefix blocks, cut the way
    ``gateway.routing.keys.block_chain`` cuts them (each text in ``chunk_chars`` pieces)."""
    total = 0
    left = depth
    for text in texts:
        n = len(text)
        pieces = max(1, -(-n // chunk_chars))
        if left >= pieces:
            total += n
            left -= pieces
        else:
            total += left * chunk_chars
            return total
        if left <= 0:
            return total
    return total


def max_tokens_of(doc: dict[str, Any]) -> int | None:
    """The request's output cap: ``max_completion_tokens`` or ``max_tokens`` (positive int)."""
    for k in ("max_completion_tokens", "max_tokens"):
        v = doc.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def measurement(rec: RequestRecord, dispatch_load: float | None, finish_load: float
                ) -> Measurement:
    """What one finished request (with ``usage``) teaches its pool's estimator: TTFT at the
    pool's load when it was dispatched (``dispatch_load``, None when unknown: then
    ``finish_load``), decode at its load when it finished — the batch its tokens were decoded
    in (requests per replica; see ``gateway.plan.auto.estimator`` for why not one average).
    Streams: TTFT and decode span (first → last content event); JSON: the total time.
    Raises ``ValueError`` when ``rec`` has no usage."""
    u = rec.usage
    if u is None:
        raise ValueError("a measurement needs the request's usage")
    if not rec.stream:
        return Measurement(u.prompt, u.cached, u.completion, finish_load, total_s=rec.ttft_s,
                           ttft_load=dispatch_load)
    itl = rec.itl
    decode = itl.span_s if itl is not None and itl.n else None
    return Measurement(u.prompt, u.cached, u.completion, finish_load, ttft_s=rec.ttft_s,
                       decode_s=decode, ttft_load=dispatch_load)


class AutoTier:
    """Estimators and policy state of every model that has both tiers."""

    def __init__(
        self, config: GatewayConfig, pools: PoolRegistry, rng: random.Random | None = None
    ) -> None:
        self.pools = pools
        self.models: dict[str, AutoConfig] = {n: m.auto for n, m in config.models.items()}
        self.params = {
            n: AutoParams(
                switch_margin=m.auto.switch_margin,
                explore_share=m.auto.explore_share,
                explore_stale_s=m.auto.explore_stale_s,
                min_samples=m.auto.min_samples,
                cold_fast_max_load=m.auto_fast_max_inflight_per_replica,
            )
            for n, m in config.models.items()
        }
        self.estimators: dict[str, PoolEstimator] = {
            p.key: PoolEstimator(self.models[p.model].half_life_s, p.tier,
                                 stale_s=self.models[p.model].explore_stale_s)
            for p in pools.all()
        }
        self.stale_streak: Counter[str] = Counter()  # per model: explorable, not explored
        self.sessions: dict[str, AffinityTable] = {
            n: AffinityTable(m.auto.session_table_entries, m.auto.session_ttl_s,
                             max_bytes=m.auto.session_table_max_bytes)
            for n, m in config.models.items()
        }
        seed = next((m.auto.seed for m in config.models.values() if m.auto.seed is not None), None)
        self.rng = rng or random.Random(seed)
        self.decisions: Counter[tuple[str, str, str]] = Counter()  # (model, tier, reason)
        self._spec_prev: dict[str, tuple[float, float]] = {}  # replica url → (drafts, accepted)
        self._tasks: list[asyncio.Task[None]] = []

    # -- decision --------------------------------------------------------------------------
    async def choose(
        self, req: TierRequest, route: RouteRequest, doc: dict[str, Any]
    ) -> AutoChoice | None:
        """Decide standard or fast for one ``auto`` request; None when the model lacks either
        pool (the plan's structural rules answer then)."""
        std = self.pools.get(req.model_name, "standard")
        fast = self.pools.get(req.model_name, "fast")
        if std is None or fast is None:
            return None
        now = time.monotonic()
        cached_std, cached_fast = await asyncio.gather(
            _cached_tokens(std, route), _cached_tokens(fast, route)
        )
        prompt = route.chars / CHARS_PER_TOKEN
        table = self.sessions[req.model_name]
        session_tier = table.get(route.session_key)
        est_std = self.estimators[std.key]
        est_fast = self.estimators[fast.key]
        typical = est_fast.output_tokens.value or est_std.output_tokens.value
        facts = RequestFacts(prompt, expected_output_tokens(max_tokens_of(doc), typical),
                             session_tier)
        views = [
            PoolView(p.tier, bool(p.usable(now)), pool_load(p, now), cached, e.snapshot(now))
            for p, cached, e in ((std, cached_std, est_std), (fast, cached_fast, est_fast))
        ]
        model = req.model_name
        decision = decide(facts, views[0], views[1], self.params[model], self.rng.random(),
                          self.stale_streak[model])
        if decision.reason == "explore":
            self.stale_streak[model] = 0
        elif decision.explorable:
            self.stale_streak[model] += 1
        table.put(route.session_key, decision.tier)
        self.decisions[(req.model_name, decision.tier, decision.reason)] += 1
        return AutoChoice(decision, std.key if decision.tier == "standard" else fast.key)

    def cheaper(self, req: TierRequest, allowed_tiers: frozenset[str] | None) -> AutoChoice:
        """The cheaper tier for an ``auto`` request whose session is past its budget's soft
        share (reason ``session-budget``): lowest input + output price per token among the
        tiers the key may use; standard on a tie."""
        tiers = [t for t in req.model.tiers if allowed_tiers is None or t in allowed_tiers]
        tier = min(tiers or list(req.model.tiers), key=lambda t: (
            req.model.tiers[t].prices.input_per_mtok_usd
            + req.model.tiers[t].prices.output_per_mtok_usd, t != "standard"))
        self.decisions[(req.model_name, tier, "session-budget")] += 1
        return AutoChoice(TierDecision(tier, "session-budget"), f"{req.model_name}/{tier}")

    def entitlement_denied(self, model: str) -> None:
        """Count an ``auto`` request served standard because its key lacks the fast tier."""
        self.decisions[(model, "standard", "no-fast-entitlement")] += 1

    # -- measurement -----------------------------------------------------------------------
    def observe(self, rec: RequestRecord) -> None:
        """Learn from one finished request (any tier): successful ones with usage only."""
        if rec.outcome != "ok" or not rec.served_tier or not rec.model or rec.usage is None:
            return
        pool = self.pools.get(rec.model, rec.served_tier)
        if pool is None:
            return
        est = self.estimators.get(pool.key)
        if est is None:
            return
        now = time.monotonic()
        choice = rec.auto_choice
        dispatch = None
        if isinstance(choice, AutoChoice) and choice.pool_key == pool.key:
            dispatch = choice.decision.loads.get(pool.tier)
        m = measurement(rec, dispatch, pool_load(pool, now))
        est.observe(m, now)

    # -- speculative decoding counters -----------------------------------------------------
    def start(self) -> None:
        """Every ``acceptance_scrape_interval_s``, turn the fast pools' spec-decode counters
        (read by the engine load scraper, ``gateway.upstream.load_scraper``: no second scrape of
        the engines) into tokens per step (call from the running loop)."""
        loop = asyncio.get_running_loop()
        for pool in self.pools.all():
            interval = self.models[pool.model].acceptance_scrape_interval_s
            if pool.tier == "fast" and interval > 0:
                self._tasks.append(loop.create_task(self._acceptance_loop(pool, interval)))

    async def stop(self) -> None:
        """Cancel the loops."""
        await cancel_and_wait(self._tasks)
        self._tasks.clear()

    async def _acceptance_loop(self, pool: Pool, interval_s: float) -> None:
        while True:
            self.update_acceptance(pool)
            await asyncio.sleep(interval_s)

    def update_acceptance(self, pool: Pool) -> None:
        """Tokens per step over the last interval, ``1 + Δaccepted / Δdrafts`` summed over the
        pool's replicas (from their scraped counters), into the pool's estimator."""
        drafts = accepted = 0.0
        for r in list(pool.replicas):
            d, a = r.spec_drafts, r.spec_accepted
            prev = self._spec_prev.get(r.url)
            self._spec_prev[r.url] = (d, a)
            if prev is not None and d >= prev[0] and a >= prev[1]:
                drafts += d - prev[0]
                accepted += a - prev[1]
        if drafts > 0:
            self.estimators[pool.key].set_tokens_per_step(1.0 + accepted / drafts)

    # -- telemetry -------------------------------------------------------------------------
    def collector(self) -> Collector:
        """Prometheus collector of decisions and estimated vs measured speed per pool."""
        return _AutoCollector(self)


async def _cached_tokens(pool: Pool, route: RouteRequest) -> float:
    """Prompt tokens of this request that ``pool`` likely holds: the deepest prefix block any
    of its replicas is bound to in the routing state store (the lookup the pool's router then
    reuses), in characters / 4. 0 without a router, prefix weight, or store answer."""
    router = pool.router
    cfg = pool.config.routing
    if router is None or cfg.policy != "pipeline":
        return 0.0
    if not cfg.weights.get("prefix"):
        return 0.0
    blocks = await route.chain(cfg.chunk_chars, cfg.max_hash_chars)
    key = pool.key
    if key not in route.lookups:
        route.lookups[key] = await router.store.lookup(
            key, route.session_key, blocks, sampled_indices(len(blocks))
        )
    lookup = route.lookups[key]
    if lookup is None or not lookup.depth:
        return 0.0
    depth = max(lookup.depth.values())
    return block_end_chars(route.texts, cfg.chunk_chars, depth) / CHARS_PER_TOKEN


class _AutoCollector(Collector):
    def __init__(self, auto: AutoTier) -> None:
        self.auto = auto

    def collect(self) -> Iterator[Metric]:
        a = self.auto
        d = CounterMetricFamily(
            "speedgate_auto_decisions",
            "auto-tier decisions by model, chosen tier and reason",
            labels=["model", "tier", "reason"],
        )
        for (model, tier, reason), n in sorted(a.decisions.items()):
            d.add_metric([model, tier, reason], float(n))
        yield d
        labels = ["pool"]
        est_tps = GaugeMetricFamily(
            "speedgate_auto_estimated_output_tokens_per_second",
            "Estimated decode speed of one request on the pool at its current load (tokens/s)",
            labels=labels,
        )
        meas_tps = GaugeMetricFamily(
            "speedgate_auto_measured_output_tokens_per_second",
            "Decode speed of recent requests on the pool, decayed mean (tokens/s)",
            labels=labels,
        )
        est_ttft = GaugeMetricFamily(
            "speedgate_auto_estimated_ttft_seconds",
            "Estimated TTFT of a fully cached prompt on the pool at its current load (s)",
            labels=labels,
        )
        meas_ttft = GaugeMetricFamily(
            "speedgate_auto_measured_ttft_seconds",
            "TTFT of recent requests on the pool, decayed mean (s)",
            labels=labels,
        )
        prefill = GaugeMetricFamily(
            "speedgate_auto_prefill_seconds_per_token",
            "Fitted prefill time per uncached prompt token on the pool (s/token)",
            labels=labels,
        )
        accept = GaugeMetricFamily(
            "speedgate_auto_spec_tokens_per_step",
            "Speculative decoding: mean tokens per step (1 + accepted / drafts), last interval",
            labels=labels,
        )
        now = time.monotonic()
        for pool in a.pools.all():
            e = a.estimators.get(pool.key)
            if e is None:
                continue
            snap = e.snapshot(now)
            load = pool_load(pool, now)
            est_tps.add_metric([pool.key], 1.0 / snap.tpot_s(load))
            est_ttft.add_metric([pool.key], snap.ttft_s(load, 0.0))
            prefill.add_metric([pool.key], snap.prefill_s_per_token)
            if e.measured_tps.value is not None:
                meas_tps.add_metric([pool.key], e.measured_tps.value)
            if e.measured_ttft.value is not None:
                meas_ttft.add_metric([pool.key], e.measured_ttft.value)
            if e.tokens_per_step is not None:
                accept.add_metric([pool.key], e.tokens_per_step)
        yield from (est_tps, meas_tps, est_ttft, meas_ttft, prefill, accept)


async def choose_auto(
    auto: AutoTier | None,
    req: TierRequest,
    route: RouteRequest,
    doc: dict[str, Any],
    allowed_tiers: frozenset[str] | None,
    cheaper: bool = False,
) -> AutoChoice | None:
    """The handler's entry point: the live-estimate choice for an ``auto`` request, or None
    (not ``auto``, no ``AutoTier``, the model lacks a pool, or the key has no fast tier: then
    ``plan_request`` answers ``no-fast-entitlement``). ``cheaper``: the session is past its
    budget's soft share (``gateway.admit.budget``): the cheaper tier, reason
    ``session-budget``."""
    if req.tier != "auto" or auto is None:
        return None
    if cheaper:
        return auto.cheaper(req, allowed_tiers)
    if allowed_tiers is not None and "fast" not in allowed_tiers:
        auto.entitlement_denied(req.model_name)
        return None
    return await auto.choose(req, route, doc)
