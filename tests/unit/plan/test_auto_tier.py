"""The auto tier's policy: estimator, decision rule, hysteresis, exploration,
entitlements. Pure: no sockets."""

from __future__ import annotations

import asyncio
import math
import random

import pytest

from gateway.common.usage import Usage
from gateway.config import load_config
from gateway.fleet.pools import PoolRegistry
from gateway.plan.auto.decide import AutoParams, PoolView, RequestFacts, decide
from gateway.plan.auto.estimator import (
    DEFAULT_OUTPUT_TOKENS,
    DecayedRidge,
    Measurement,
    PoolEstimate,
    PoolEstimator,
    expected_output_tokens,
)
from gateway.plan.auto.service import (
    AutoTier,
    block_end_chars,
    choose_auto,
    max_tokens_of,
)
from gateway.plan.chain import plan_request
from gateway.plan.tiers import ModelIndex
from gateway.routing import RouteRequest
from gateway.routing.keys import block_chain
from gateway.telemetry.histograms import GapTimer
from gateway.telemetry.record import RequestRecord

# Simulator-like pools (engines/sim/perf.py at time-scale 1): TPOT = a + b·load (s/token),
# TTFT = a + b·load + c·uncached/1000.
STD = PoolEstimate((0.02, 0.0001, 0.07), (0.012, 0.0001), samples=50, age_s=0.5)
FAST = PoolEstimate((0.025, 0.0002, 0.07), (0.0058, 0.000195), samples=50, age_s=0.5)
P = AutoParams(explore_share=0.0)


def views(std_load=1.0, fast_load=1.0, std_cached=0.0, fast_cached=0.0, std=STD, fast=FAST,
          fast_ok=True, std_ok=True):
    return (PoolView("standard", std_ok, std_load, std_cached, std),
            PoolView("fast", fast_ok, fast_load, fast_cached, fast))


# --- estimator ---------------------------------------------------------------------------


def test_ridge_fits_a_line_across_loads():
    m = DecayedRidge(((0.0, 0.01), (0.0, 100.0)), half_life_s=30)
    for i, load in enumerate([1, 10, 50, 100, 200] * 4):
        m.observe((1.0, load), 0.012 + 0.0001 * load, now=i * 0.1)
    a, b = m.beta
    assert a == pytest.approx(0.012, rel=0.02) and b == pytest.approx(0.0001, rel=0.02)


def test_ridge_at_one_load_explains_by_intercept_and_decays_to_new_regime():
    m = DecayedRidge(((0.0, 0.01), (0.0, 100.0)), half_life_s=1.0)
    for i in range(20):
        m.observe((1.0, 1.0), 0.010, now=i * 0.01)
    assert m.predict((1.0, 1.0)) == pytest.approx(0.010, rel=0.05)
    assert abs(m.beta[1]) < 0.001  # no made-up slope from data at one load
    for i in range(20):  # 10 half-lives later the pool is 3x slower
        m.observe((1.0, 1.0), 0.030, now=10 + i * 0.01)
    assert m.predict((1.0, 1.0)) == pytest.approx(0.030, rel=0.05)


def test_ridge_decay_keeps_a_floor_of_weight():
    m = DecayedRidge(((0.0, 0.01),), half_life_s=1.0, min_weight=1.0)
    for i in range(10):
        m.observe((1.0,), 5.0, now=i)
    m.observe((1.0,), 5.0, now=1e6)  # a week of silence: the old fit still counts
    assert m.weight >= 1.0 and m.predict((1.0,)) == pytest.approx(5.0, rel=0.01)


def test_pool_estimator_learns_ttft_prefill_and_tpot():
    e = PoolEstimator(half_life_s=60)
    rng = random.Random(1)
    for i in range(60):
        load = rng.choice([1, 20, 80])
        uncached = rng.choice([100, 2000, 8000])
        ttft = 0.03 + 0.0002 * load + 0.00007 * uncached
        tpot = 0.006 + 0.0002 * load
        e.observe(Measurement(uncached + 500, 500, 65, load, ttft_s=ttft, decode_s=64 * tpot),
                  now=i * 0.1)
    s = e.snapshot(now=6.0)
    assert s.prefill_s_per_token == pytest.approx(0.00007, rel=0.05)
    assert s.tpot_s(50) == pytest.approx(0.006 + 0.0002 * 50, rel=0.05)
    assert s.ttft_s(50, 1000) == pytest.approx(0.03 + 0.01 + 0.07, rel=0.05)
    assert s.samples == 60 and s.age_s == pytest.approx(0.1, abs=0.01)
    assert e.output_tokens.value == pytest.approx(65)


def test_idle_only_fit_still_expects_fast_to_slow_down_under_load():
    std, fast = PoolEstimator(tier="standard"), PoolEstimator(tier="fast")
    for i in range(10):  # both measured only idle: fast 2x faster
        std.observe(Measurement(500, 0, 33, 1.0, ttft_s=0.03, decode_s=32 * 0.012), now=i)
        fast.observe(Measurement(500, 0, 33, 1.0, ttft_s=0.03, decode_s=32 * 0.006), now=i)
    s, f = std.snapshot(10), fast.snapshot(10)
    assert f.tpot_s(1) < s.tpot_s(1) / 1.8
    assert f.tpot_s(128) > s.tpot_s(128)  # the relative slope prior (vLLM's spec-decode shape)
    # measured at high load, the data wins over the prior
    for i in range(10):
        fast.observe(Measurement(500, 0, 33, 100.0, ttft_s=0.03, decode_s=32 * 0.008),
                     now=20 + i)
    assert fast.snapshot(30).tpot_s(100) == pytest.approx(0.008, rel=0.1)
    # measured only busy: the idle speed is inferred along the prior's shape
    busy = PoolEstimator(tier="standard")
    for i in range(10):
        busy.observe(Measurement(500, 0, 33, 60.0, ttft_s=0.1, decode_s=32 * 0.018), now=i)
    assert busy.snapshot(10).tpot_s(0) == pytest.approx(0.018 / (1 + 60 / 120), rel=0.05)


def test_json_response_learns_tpot_through_predicted_ttft():
    e = PoolEstimator()
    for i in range(10):
        e.observe(Measurement(100, 0, 11, 1.0, ttft_s=0.05, decode_s=0.1), now=i)
    e.observe(Measurement(100, 0, 11, 1.0, total_s=0.05 + 10 * 0.02), now=11)
    assert e.tpot.samples == 11


def test_acceptance_drop_slows_the_fast_estimate():
    e = PoolEstimator()
    e.set_tokens_per_step(2.8)
    for i in range(10):
        e.observe(Measurement(100, 0, 33, 1.0, ttft_s=0.02, decode_s=32 * 0.006), now=i)
    before = e.snapshot(10).tpot_s(1)
    e.set_tokens_per_step(1.4)  # acceptance fell: half the tokens per step
    assert e.snapshot(10).tpot_s(1) == pytest.approx(2 * before, rel=0.01)
    e.set_tokens_per_step(None)
    assert e.acceptance_factor() == 1.0


@pytest.mark.parametrize(
    ("max_tokens", "typical", "expected"),
    [(None, None, DEFAULT_OUTPUT_TOKENS), (100, None, 100), (None, 40.0, 40.0),
     (100, 40.0, 40.0), (20, 40.0, 20.0)],
)
def test_expected_output_tokens(max_tokens, typical, expected):
    assert expected_output_tokens(max_tokens, typical) == expected


def test_max_tokens_of():
    assert max_tokens_of({"max_tokens": 5}) == 5
    assert max_tokens_of({"max_completion_tokens": 7, "max_tokens": 5}) == 7
    assert max_tokens_of({"max_tokens": True}) is None and max_tokens_of({}) is None


# --- decision rule -----------------------------------------------------------------------

CASES = [
    # (name, facts, views kwargs, expected tier, reason)
    ("idle: speculative wins", RequestFacts(500, 64), {}, "fast", "fast-faster"),
    ("fast busy, standard light", RequestFacts(500, 64), {"fast_load": 150, "std_load": 20},
     "standard", "fast-saturated"),
    ("both busy alike: standard's flatter slope", RequestFacts(500, 64),
     {"fast_load": 200, "std_load": 200}, "standard", "fast-saturated"),
    ("fast busy but standard busier", RequestFacts(500, 64),
     {"fast_load": 100, "std_load": 250}, "fast", "fast-faster"),
    ("fast pool down", RequestFacts(500, 64), {"fast_ok": False}, "standard",
     "fast-unavailable"),
    ("standard pool down", RequestFacts(500, 64), {"std_ok": False}, "fast",
     "standard-unavailable"),
    ("long prefix cached on standard only", RequestFacts(60_000, 16),
     {"std_cached": 59_000}, "standard", "prefix-on-standard"),
    ("long prefix cached on fast, fast busy", RequestFacts(60_000, 64),
     {"fast_cached": 59_000, "fast_load": 80, "std_load": 10}, "fast", "prefix-on-fast"),
    ("short prompt: the cache does not matter", RequestFacts(600, 64), {"std_cached": 500},
     "fast", "fast-faster"),
    ("low acceptance: fast slower even idle", RequestFacts(500, 64),
     {"fast": PoolEstimate((0.025, 0.0002, 0.07), (0.016, 0.0005), 50, 0.5)},
     "standard", "standard-faster"),
    ("cold pools, fast idle", RequestFacts(500, 64),
     {"std": None, "fast": None}, "fast", "fast-idle"),
    ("cold pools, fast busy", RequestFacts(500, 64),
     {"std": None, "fast": None, "fast_load": 10}, "standard", "fast-saturated"),
]


@pytest.mark.parametrize(("name", "facts", "kw", "tier", "reason"), CASES,
                         ids=[c[0] for c in CASES])
def test_decision_table(name, facts, kw, tier, reason):
    d = decide(facts, *views(**kw), P, draw=0.99)
    assert (d.tier, d.reason) == (tier, reason)


def test_decision_reports_expected_times_and_loads():
    d = decide(RequestFacts(500, 64), *views(std_load=3, fast_load=2), P, draw=0.5)
    assert d.loads == {"standard": 3, "fast": 2}
    assert d.expected_s["fast"] < d.expected_s["standard"]
    assert d.expected_s["standard"] == pytest.approx(STD.completion_s(3, 500, 64))


# --- hysteresis --------------------------------------------------------------------------


def test_session_stays_unless_the_gain_beats_the_margin():
    # fast busy enough that standard is faster by a little: a fast session stays
    facts = RequestFacts(500, 64, session_tier="fast")
    kw = {"fast_load": 37, "std_load": 1}
    fresh = decide(RequestFacts(500, 64), *views(**kw), P, draw=0.99)
    assert fresh.tier == "standard"
    gain = 1 - fresh.expected_s["standard"] / fresh.expected_s["fast"]
    assert 0 < gain < P.switch_margin
    d = decide(facts, *views(**kw), P, draw=0.99)
    assert (d.tier, d.reason) == ("fast", "session-sticky")
    # much busier: the gain outweighs the margin and the session moves
    d = decide(facts, *views(fast_load=150, std_load=1), P, draw=0.99)
    assert (d.tier, d.reason) == ("standard", "fast-saturated")


def test_re_prefill_cost_keeps_a_long_session_where_its_cache_is():
    # 30k-token conversation cached on fast; fast is busier: moving costs ~2 s of prefill
    facts = RequestFacts(30_000, 64, session_tier="fast")
    d = decide(facts, *views(fast_load=60, std_load=1, fast_cached=29_800), P, draw=0.99)
    assert d.tier == "fast" and d.reason in ("prefix-on-fast", "session-sticky")
    # a new session with no cache anywhere goes to the faster pool
    d = decide(RequestFacts(30_000, 64), *views(fast_load=60, std_load=1), P, draw=0.99)
    assert d.tier == "standard"


# --- exploration -------------------------------------------------------------------------


def _explore_run(seed: int, n: int = 2000, age_s: float = 60.0) -> list[str]:
    stale_std = PoolEstimate(STD.ttft_beta, STD.tpot_beta, samples=50, age_s=age_s)
    rng = random.Random(seed)
    params = AutoParams(explore_share=0.05, explore_stale_s=10.0)
    return [decide(RequestFacts(500, 64), *views(std=stale_std), params, rng.random()).reason
            for _ in range(n)]


def test_exploration_is_seeded_and_near_its_share():
    a, b = _explore_run(7), _explore_run(7)
    assert a == b  # same seed, same decisions
    share = a.count("explore") / len(a)
    assert 0.03 < share < 0.07
    assert _explore_run(8) != a


def test_no_exploration_when_the_other_pool_is_fresh_or_the_session_has_a_pool():
    assert "explore" not in _explore_run(7, n=500, age_s=1.0)
    stale = PoolEstimate(STD.ttft_beta, STD.tpot_beta, samples=50, age_s=60)
    params = AutoParams(explore_share=1.0)
    d = decide(RequestFacts(500, 64, session_tier="fast"), *views(std=stale), params, 0.0)
    assert d.reason == "fast-faster"
    d = decide(RequestFacts(500, 64), *views(std=stale), params, 0.0)
    assert (d.tier, d.reason) == ("standard", "explore")


# --- the service, plan and entitlements ---------------------------------------------------


def _cfg(**auto):
    return load_config(models={"m": {
        "aliases": {"m-auto": "auto"},
        "fallback": {"fast": "standard"},
        "auto": {"seed": 3, "explore_share": 0.0, **auto},
        "tiers": {
            "standard": {"served_model_name": "m", "endpoints": ["http://s1:1", "http://s2:1"]},
            "fast": {"served_model_name": "m", "endpoints": ["http://f1:1", "http://f2:1"]},
        },
    }})


def _finish(auto: AutoTier, tier: str, ttft: float, decode: float, tokens: int = 33) -> None:
    rec = RequestRecord("r", "/v1/chat/completions", model="m", served_tier=tier,
                        outcome="ok", stream=True, ttft_s=ttft)
    rec.usage = Usage(500, tokens, 0)
    rec.itl = GapTimer()
    rec.itl.tick(0.0)
    rec.itl.tick(decode)
    auto.observe(rec)


def test_service_learns_and_decides_with_session_hysteresis():
    cfg = _cfg()
    pools = PoolRegistry(cfg)
    auto = AutoTier(cfg, pools)
    req = ModelIndex(cfg).resolve("m-auto", None, None)
    doc = {"model": "m-auto", "messages": [{"role": "user", "content": "hi " * 500}],
           "max_tokens": 32}

    def choose(session: str):
        return asyncio.run(auto.choose(req, RouteRequest.from_doc(doc, session), doc))

    assert choose("a").reason == "fast-idle"  # cold: the load threshold
    for _ in range(5):
        _finish(auto, "standard", 0.05, 32 * 0.012)
        _finish(auto, "fast", 0.05, 32 * 0.006)
    c = choose("b")
    assert (c.tier, c.reason) == ("fast", "fast-faster")
    assert c.expected_s == pytest.approx(c.decision.expected_s["fast"])
    # the fast pool becomes slower than standard by a small margin: session b stays
    for _ in range(30):
        _finish(auto, "fast", 0.05, 32 * 0.0135)
    c = choose("b")
    assert (c.tier, c.reason) == ("fast", "session-sticky")
    assert choose("c").tier == "standard"  # a new session takes the faster pool
    assert auto.decisions[("m", "fast", "session-sticky")] == 1
    metrics = {m.name: m for m in auto.collector().collect()}
    assert metrics["speedgate_auto_decisions"].samples
    assert metrics["speedgate_auto_measured_output_tokens_per_second"].samples


def test_entitlement_without_fast_serves_standard():
    cfg = _cfg()
    pools = PoolRegistry(cfg)
    auto = AutoTier(cfg, pools)
    req = ModelIndex(cfg).resolve("m-auto", None, None)
    doc = {"model": "m-auto", "messages": [{"role": "user", "content": "hi"}]}
    route = RouteRequest.from_doc(doc, None)
    allowed = frozenset({"standard"})
    choice = asyncio.run(choose_auto(auto, req, route, doc, allowed))
    assert choice is None and auto.decisions[("m", "standard", "no-fast-entitlement")] == 1
    plan = plan_request(req, pools, allowed, choice)
    assert (plan.chain[0].tier, plan.reason) == ("standard", "no-fast-entitlement")
    assert [p.tier for p in plan.chain] == ["standard"]
    # entitled: the auto choice is the plan
    choice = asyncio.run(choose_auto(auto, req, route, doc, None))
    plan = plan_request(req, pools, None, choice)
    assert (plan.chain[0].tier, plan.reason) == (choice.tier, choice.reason)
    assert plan.auto is choice


def test_block_end_chars_matches_block_chain():
    texts = ["a" * 5000, "b" * 10, "", "c" * 4100]
    chunk = 2048
    n = len(block_chain(texts, chunk, 10**9))
    ends = [block_end_chars(texts, chunk, d) for d in range(n + 1)]
    assert ends[0] == 0 and ends[-1] == sum(map(len, texts))
    assert ends[1] == 2048 and ends[3] == 5000 and ends[4] == 5010
    assert ends == sorted(ends)


def test_spec_counters_come_from_the_one_engine_scrape():
    from gateway.upstream.load_scraper import SPEC_ACCEPTED, SPEC_DRAFTS, parse_engine_metrics

    text = (
        "# TYPE vllm:spec_decode_num_drafts counter\n"
        'vllm:spec_decode_num_drafts_total{engine="0"} 100\n'
        "# TYPE vllm:spec_decode_num_accepted_tokens counter\n"
        'vllm:spec_decode_num_accepted_tokens_total{engine="0"} 177\n'
    )
    values = parse_engine_metrics(text)
    assert (values[SPEC_DRAFTS], values[SPEC_ACCEPTED]) == (100.0, 177.0)
    assert SPEC_DRAFTS not in parse_engine_metrics("")


# --- auto tier stuck on the slower pool ----------------------------------------


def _decode(tokens: int, tpot: float, fixed: float) -> float:
    """First → last content event of a stream of ``tokens`` output tokens: a fixed cost per
    request (the finish step, a tool call's header) plus ``tpot`` per token after the first."""
    return fixed + (tokens - 1) * tpot


def test_item3_auto_short_outputs_and_tool_calls_do_not_poison_the_per_token_estimate():
    std, fast = PoolEstimator(tier="standard"), PoolEstimator(tier="fast")
    t = 0.0
    for _ in range(10):  # ordinary requests on both pools: fast 2x faster per token
        t += 0.5
        for est, tpot, fixed in ((std, 0.012, 0.012), (fast, 0.006, 0.040)):
            est.observe(Measurement(500, 0, 65, 1.0, ttft_s=0.03,
                                    decode_s=_decode(65, tpot, fixed)), now=t)
    for i in range(30):  # then max_tokens 4 requests and tool-call streams, all on fast
        t += 0.5
        n = 4 if i % 3 else 20
        fast.observe(Measurement(500, 0, n, 1.0, ttft_s=0.03,
                                 decode_s=_decode(n, 0.006, 0.040)), now=t)
    f, s = fast.snapshot(t), std.snapshot(t)
    assert f.tpot_s(1.0) == pytest.approx(0.006, rel=0.1)
    assert f.decode_fixed_s == pytest.approx(0.040, rel=0.2)
    # the estimate of a 64-token request on each pool matches what it measures
    assert f.completion_s(1.0, 0, 64) == pytest.approx(0.03 + _decode(64, 0.006, 0.04), rel=0.1)
    assert s.completion_s(1.0, 0, 64) == pytest.approx(0.03 + _decode(64, 0.012, 0.012), rel=0.1)
    # and an idle auto request of that size goes fast
    d = decide(RequestFacts(500, 64), PoolView("standard", True, 1.0, 0.0, s),
               PoolView("fast", True, 1.0, 0.0, f), P, draw=0.99)
    assert (d.tier, d.reason) == ("fast", "fast-faster")
    # the measured-speed gauge weighs requests by their tokens too
    assert 1 / fast.measured_tps.value == pytest.approx(0.006 + 0.04 / 40, rel=0.5)


class _Never:
    """An RNG whose draws never fall under the exploration share (adversarial luck)."""

    @staticmethod
    def random() -> float:
        return 0.999


def test_item3_auto_exploration_corrects_a_wrong_estimate_within_bounded_requests(monkeypatch):
    """The fast pool's estimate is wrong (it was slow a while ago, e.g. low speculative
    acceptance; now it is 2x faster than standard). Requests go to standard; once fast's
    estimate is ``explore_stale_s`` old, at most ``ceil(1 / explore_share)`` new sessions pass
    before one explores fast, whatever the draws, and that one measurement corrects it."""
    import gateway.plan.auto.service as service

    clock = [0.0]
    monkeypatch.setattr(service, "time", type("T", (), {"monotonic": lambda: clock[0]}))
    cfg = _cfg(explore_share=0.05, explore_stale_s=10.0)
    pools = PoolRegistry(cfg)
    auto = AutoTier(cfg, pools, rng=_Never())  # type: ignore[arg-type]
    req = ModelIndex(cfg).resolve("m-auto", None, None)
    for _ in range(30):
        clock[0] += 0.1
        _finish(auto, "standard", 0.05, _decode(33, 0.012, 0.0))
        _finish(auto, "fast", 0.05, _decode(33, 0.020, 0.0))  # the old, wrong picture
    picks = []
    for i in range(60):  # one new session a second
        clock[0] += 1.0
        doc = {"model": "m-auto", "messages": [{"role": "user", "content": f"task {i}"}],
               "max_tokens": 32}
        c = asyncio.run(auto.choose(req, RouteRequest.from_doc(doc, f"s{i}"), doc))
        picks.append(c.reason)
        _finish(auto, c.tier, 0.05, _decode(33, 0.006 if c.tier == "fast" else 0.012, 0.0))
    bound = 10 + math.ceil(1 / 0.05)  # stale after 10 s, then at most 20 explorable requests
    first = picks.index("explore")
    assert first < bound, picks
    after = picks[first + 1:]  # corrected: fast from then on, but for standard's explorations
    assert set(after) == {"fast-faster", "explore"}, picks
    assert after.count("explore") <= len(after) // bound + 1, picks
