"""The ``auto`` decision: standard or fast for one request, from the pools' live estimates.
Pure: pool views and request facts in, a ``TierDecision`` out (the random draw is an input).

For each pool, the expected upstream time of *this* request (``PoolEstimate.completion_s``):
TTFT at the pool's current load with the prompt tokens not cached there (prompt − the prefix
the pool holds for this session), plus the expected output tokens × TPOT at that load. The
smaller wins, with, in order:

1. **availability**: a pool with no usable replica is never chosen (``fast-unavailable``,
   ``standard-unavailable``);
2. **exploration**: when the pool about to lose has no fresh measurement (none within
   ``explore_stale_s``) and the request starts a session (no turn was routed yet, so no cache
   is forfeited), it goes there with probability ``explore_share`` (``explore``), so an unused
   pool's estimate keeps up with reality (an ε-greedy bandit restricted to stale arms); and at
   the latest on the ``ceil(1 / explore_share)``-th such request in a row (``stale_streak``
   counts those that did not explore), so a wrong estimate is corrected within a bounded
   number of requests whatever the draws;
3. **cold start**: while a pool has fewer than ``min_samples`` measured requests, the
   foundation's rule decides: fast while its mean load per replica is under
   ``cold_fast_max_load`` (``fast-idle``), else standard (``fast-saturated``);
4. **hysteresis**: a session stays on the pool its last turn used unless the other is faster
   by more than ``switch_margin`` of the stay time (``session-sticky``) — the re-prefill a flip
   costs is already in the other pool's time, the margin absorbs estimate noise so a session
   does not flip every turn;
5. the reason for a speed choice: ``prefix-on-<tier>`` when the chosen pool wins only because
   of the prefix it caches (with equal caches the other would win); else ``fast-faster``,
   or ``fast-saturated`` when standard wins though fast would win on an idle pool (load is
   what makes fast slower), or ``standard-faster`` (fast is slower even idle, e.g. low
   speculative acceptance).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gateway.plan.auto.estimator import PoolEstimate

TIERS = ("standard", "fast")


@dataclass(frozen=True, slots=True)
class PoolView:
    """One pool at decision time. ``load``: mean requests per replica now; ``cached_tokens``:
    this request's prompt tokens the pool likely holds in its prefix cache; ``estimate``: its
    fitted models."""

    tier: str
    available: bool
    load: float
    cached_tokens: float
    estimate: PoolEstimate | None


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """``prompt_tokens``: estimated (bytes / 4, no tokenizer); ``output_tokens``: expected;
    ``session_tier``: the tier the session's previous turn went to (None: new session)."""

    prompt_tokens: float
    output_tokens: float
    session_tier: str | None = None


@dataclass(frozen=True, slots=True)
class AutoParams:
    """Tuning of the rule (``gateway.config.AutoConfig`` documents each)."""

    switch_margin: float = 0.15
    explore_share: float = 0.05
    explore_stale_s: float = 10.0
    min_samples: int = 3
    cold_fast_max_load: float = 4.0


@dataclass(frozen=True, slots=True)
class TierDecision:
    """The tier chosen, why, and the expected upstream seconds per tier (None: not
    estimated) with the load each was estimated at; ``explorable``: whether this request
    could have explored (the caller's ``stale_streak`` counts those that did not)."""

    tier: str
    reason: str
    expected_s: dict[str, float] = field(default_factory=dict)
    loads: dict[str, float] = field(default_factory=dict)
    explorable: bool = False  # the losing pool was stale and the session new: could explore


def _other(tier: str) -> str:
    return "fast" if tier == "standard" else "standard"


def _stale(v: PoolView, p: AutoParams) -> bool:
    e = v.estimate
    return e is None or e.samples < p.min_samples or e.age_s > p.explore_stale_s


def _time(v: PoolView, facts: RequestFacts, cached: float) -> float:
    assert v.estimate is not None
    uncached = max(0.0, facts.prompt_tokens - cached)
    return v.estimate.completion_s(v.load, uncached, facts.output_tokens)


def decide(
    facts: RequestFacts,
    standard: PoolView,
    fast: PoolView,
    params: AutoParams,
    draw: float,
    stale_streak: int = 0,
) -> TierDecision:
    """Choose the tier for one ``auto`` request. ``draw``: a uniform [0, 1) random number (the
    caller's seeded RNG) used for exploration only; ``stale_streak``: explorable requests in a
    row that did not explore (the ``ceil(1 / explore_share)``-th explores whatever its draw)."""
    views = {"standard": standard, "fast": fast}
    loads = {t: v.load for t, v in views.items()}
    if not fast.available:
        return TierDecision("standard", "fast-unavailable", loads=loads)
    if not standard.available:
        return TierDecision("fast", "standard-unavailable", loads=loads)
    cold = [t for t, v in views.items()
            if v.estimate is None or v.estimate.samples < params.min_samples]
    expected: dict[str, float] = {}
    if cold:
        if fast.load < params.cold_fast_max_load:
            tier, reason = "fast", "fast-idle"
        else:
            tier, reason = "standard", "fast-saturated"
    else:
        expected = {t: _time(v, facts, v.cached_tokens) for t, v in views.items()}
        tier, reason = _by_speed(facts, views, expected, params)
    other = _other(tier)
    explorable = (
        facts.session_tier is None and params.explore_share > 0 and _stale(views[other], params)
    )
    if explorable and (
        draw < params.explore_share
        or stale_streak + 1 >= math.ceil(1.0 / params.explore_share)
    ):
        return TierDecision(other, "explore", expected, loads, explorable=True)
    return TierDecision(tier, reason, expected, loads, explorable=explorable)


def _by_speed(
    facts: RequestFacts,
    views: dict[str, PoolView],
    expected: dict[str, float],
    params: AutoParams,
) -> tuple[str, str]:
    best = min(TIERS, key=lambda t: (expected[t], t != "fast"))  # a tie goes fast
    stay = facts.session_tier
    if stay in views and stay != best:
        if expected[best] > expected[stay] * (1.0 - params.switch_margin):
            return stay, "session-sticky"
    # would the other pool win if both held the same prefix?
    shared = max(v.cached_tokens for v in views.values())
    even = {t: _time(v, facts, shared) for t, v in views.items()}
    if min(TIERS, key=lambda t: (even[t], t != "fast")) != best:
        return best, f"prefix-on-{best}"
    if best == "fast":
        return best, "fast-faster"
    f, s = views["fast"].estimate, views["standard"].estimate
    assert f is not None and s is not None
    idle_fast = f.completion_s(0.0, facts.prompt_tokens, facts.output_tokens)
    idle_std = s.completion_s(0.0, facts.prompt_tokens, facts.output_tokens)
    return best, "fast-saturated" if idle_fast < idle_std else "standard-faster"
