"""Move or wait when a session's warm replica has no KV room: tables of replicas, open
attempts and rates against the choice and its figures."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry

from gateway.account import observe_rates
from gateway.common.usage import Usage
from gateway.config import load_config
from gateway.fleet.pools import PoolRegistry, Replica
from gateway.fleet.rates import DEFAULT_DECODE_TOK_S, DEFAULT_PREFILL_TOK_S, PoolRates
from gateway.routing.kv_placement import Placement, decide, wait_s
from gateway.routing.service import RoutingService
from gateway.telemetry.record import RequestRecord

NOW = 1000.0


def _replica(name: str, kv_tokens: int, open_kv: list[tuple[int, int, float]]) -> Replica:
    """A replica of ``kv_tokens`` KV tokens (16-token blocks) whose open attempts are
    ``(kv tokens, output cap, started seconds ago)``."""
    r = Replica(f"http://{name}", "m/standard", name=name, kv_num_blocks=kv_tokens // 16,
                kv_block_size=16, max_model_len=kv_tokens)
    r.open_kv = {i: (kv, cap, NOW - ago) for i, (kv, cap, ago) in enumerate(open_kv)}
    r.inflight_kv_tokens = sum(kv for kv, _, _ in open_kv)
    return r


@pytest.mark.parametrize(
    ("open_kv", "need", "decode", "want"),
    [
        ([], 1_000, 30.0, 0.0),  # empty: room now
        ([(9_000, 300, 0.0)], 2_000, 30.0, 10.0),  # 300 tokens left at 30/s frees 9k
        ([(9_000, 300, 5.0)], 2_000, 30.0, 5.0),  # 150 already decoded: 150 left
        ([(5_000, 600, 0.0), (5_000, 60, 0.0)], 500, 30.0, 2.0),  # the short one suffices
        ([(5_000, 600, 0.0), (5_000, 60, 0.0)], 6_000, 30.0, 20.0),  # needs both
        ([(4_000, 60, 0.0)], 20_000, 30.0, math.inf),  # more than the pool
        ([(9_000, 3_000, 0.0)], 2_000, 300.0, 10.0),  # a faster decode
        # no output cap (0): it may run to max_model_len (10k here), not end "now" (which
        # made every wait 0 s): 1,000 tokens at 30/s
        ([(9_000, 0, 0.0)], 2_000, 30.0, 1_000 / 30),
        ([(5_000, 0, 0.0), (5_000, 60, 0.0)], 500, 30.0, 2.0),  # the capped one suffices
    ],
)
def test_wait_s_table(open_kv: list[tuple[int, int, float]], need: int, decode: float,
                      want: float) -> None:
    home = _replica("home", 10_000, open_kv)
    assert wait_s(home, need, NOW, decode) == pytest.approx(want)


@pytest.mark.parametrize(
    ("home_open", "other_open", "need", "cap", "cached", "prefill", "want"),
    [
        # room at home: stay, nothing weighed
        ([], [], 2_000, 200, 0, 5_000.0, Placement("stay")),
        # full home, its request ends in 10 s; moving re-prefills 1,800 tokens at 5k/s
        ([(9_000, 300, 0.0)], [], 2_000, 200, 0, 5_000.0, Placement("move", 0.36, 10.0)),
        # a slow prefill (100 tok/s): 18 s to move > 10 s to wait
        ([(9_000, 300, 0.0)], [], 2_000, 200, 0, 100.0, Placement("wait", 18.0, 10.0)),
        # the other replica holds 1,700 of the prompt: 100 tokens at 100 tok/s = 1 s
        ([(9_000, 300, 0.0)], [], 2_000, 200, 1_700, 100.0, Placement("move", 1.0, 10.0)),
        # nowhere has room: wait (nothing to move to)
        ([(9_000, 300, 0.0)], [(9_500, 30, 0.0)], 2_000, 200, 0, 5_000.0,
         Placement("wait", None, 10.0)),
        # the engine holds more than this gateway's attempts (other gateways'): never enough
        ([(4_000, 30, 0.0)], [], 9_000, 0, 0, 5_000.0, Placement("move", 1.8, math.inf)),
    ],
)
def test_decide_table(home_open: list[tuple[int, int, float]],
                      other_open: list[tuple[int, int, float]], need: int, cap: int,
                      cached: int, prefill: float, want: Placement) -> None:
    home = _replica("home", 10_000, home_open)
    other = _replica("other", 10_000, other_open)
    if want.wait_s == math.inf:  # the engine reports 80 % in use, 4,000 of it ours
        home.kv_cache_usage, home.engine_load_at = 0.8, NOW
    rates = PoolRates(prefill_tok_s=prefill, decode_tok_s=30.0, prefill_samples=1)
    got, roomy = decide(home, [other], need, cap, lambda r: cached, rates, NOW)
    assert got.choice == want.choice
    for field in ("move_s", "wait_s"):
        g, w = getattr(got, field), getattr(want, field)
        assert (g is None and w is None) or g == pytest.approx(w)
    assert roomy == ([other] if want.choice == "move" else [])
    if want.choice != "stay":
        assert got.figures() is not None and got.figures().startswith("move_s=")
    else:
        assert got.figures() is None


def test_rates_start_at_the_defaults_and_follow_measurements() -> None:
    r = PoolRates()
    assert (r.prefill_tok_s, r.decode_tok_s) == (DEFAULT_PREFILL_TOK_S, DEFAULT_DECODE_TOK_S)
    r.observe(prompt=10, cached=0, completion=2, ttft_s=0.1, decode_s=0.1)  # too small: ignored
    assert r.prefill_samples == r.decode_samples == 0
    r.observe(prompt=12_000, cached=2_000, completion=101, ttft_s=1.0, decode_s=2.0)
    assert r.prefill_tok_s == 10_000 and r.decode_tok_s == 50  # the first replaces the default
    r.observe(prompt=2_000, cached=0, completion=51, ttft_s=1.0, decode_s=1.0)
    assert r.prefill_tok_s == pytest.approx(10_000 + 0.2 * (2_000 - 10_000))
    assert r.decode_tok_s == pytest.approx(50 + 0.2 * (50 - 50))
    r.observe(prompt=5_000, cached=0, completion=50, ttft_s=None, decode_s=1.0)  # no TTFT
    assert r.prefill_samples == 2


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf, None])
def test_rates_ignore_times_that_are_not_finite_positive(bad: float | None) -> None:
    """A 0 s, negative, NaN or infinite TTFT or decode time would make a rate infinite or NaN,
    and an EWMA never recovers from NaN: such a sample is ignored, the rates stay usable."""
    r = PoolRates()
    r.observe(prompt=10_000, cached=0, completion=100, ttft_s=bad, decode_s=bad)
    assert r.prefill_samples == r.decode_samples == 0
    assert (r.prefill_tok_s, r.decode_tok_s) == (DEFAULT_PREFILL_TOK_S, DEFAULT_DECODE_TOK_S)
    r.observe(prompt=10_000, cached=0, completion=101, ttft_s=2.0, decode_s=4.0)
    assert (r.prefill_tok_s, r.decode_tok_s) == (5_000, 25)
    assert all(math.isfinite(v) for v in (r.prefill_tok_s, r.decode_tok_s))


def _record(stream: bool, outcome: str = "ok", resumed: bool = False) -> RequestRecord:
    rec = RequestRecord("r1", "/v1/chat/completions", stream=stream, outcome=outcome,
                        ttft_s=1.0, queue_s=5.0, e2e_s=8.0,
                        usage=Usage(prompt=4_000, completion=101, cached=0))
    rec.resumes = [{"reason": "reset", "outcome": "resumed"}] if resumed else []
    return rec


def test_only_completed_unresumed_streams_feed_the_rates() -> None:
    """A JSON response's TTFT is its whole body (a prefill rate of it is too low, its decode
    time the gateway queue's), a resumed stream's usage sums attempts, a failed one's times
    are cut: none of them feeds the rates; a stream's decode time leaves its queue wait out."""
    for rec in (_record(False), _record(True, "error"), _record(True, resumed=True)):
        rates = PoolRates()
        observe_rates(rates, rec)
        assert rates.prefill_samples == rates.decode_samples == 0
    rates = PoolRates()
    observe_rates(rates, _record(True))
    assert rates.prefill_tok_s == 4_000
    assert rates.decode_tok_s == 50  # 100 tokens over 8 - 1 - 5 s, not over 8 - 1


def test_placements_are_exported_per_pool_and_choice() -> None:
    config = load_config(models={"m": {"tiers": {
        "standard": {"endpoints": ["http://127.0.0.1:9001"], "served_model_name": "m"}}}})
    pools = PoolRegistry(config)
    service = RoutingService(config, pools)
    registry = CollectorRegistry()
    service.register_metrics(registry)
    (pool,) = pools.all()
    pool.router.placements.update({"move": 2, "wait": 1})  # type: ignore[union-attr]
    got = {c: registry.get_sample_value("speedgate_kv_placements_total",
                                        {"pool": pool.key, "choice": c}) for c in ("move", "wait")}
    assert got == {"move": 2.0, "wait": 1.0}
