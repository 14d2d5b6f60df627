"""The ``auto`` tier under a jump to saturation (samples in, decision out): the situation of
``tests/e2e/test_bench_auto_tier.py`` at 128 users, where every request went fast.

Truth (``engines/sim/perf.py`` at time-scale 1): standard TPOT = 12 + 0.1·B ms; fast (k = 4,
α = 0.7, 2.77 tokens per step) TPOT = (4·(1 + 0.01·B) + 12 + 0.5·B) / 2.77 ms. At 40 standard /
88 fast per replica, standard is faster (16.0 vs 22.9 ms); at 100 / 28, fast (22.0 vs 11.2 ms).
"""

from __future__ import annotations

import pytest

from gateway.common.usage import Usage
from gateway.plan.auto.decide import AutoParams, PoolView, RequestFacts, decide
from gateway.plan.auto.estimator import Measurement, PoolEstimator
from gateway.plan.auto.service import measurement
from gateway.telemetry.histograms import GapTimer
from gateway.telemetry.record import RequestRecord

P = AutoParams(explore_share=0.0)
FACTS = RequestFacts(550, 32)  # an agent turn: ~550 prompt tokens (500 cached), 32 out


def _std_tpot(load: float) -> float:
    return (12 + 0.1 * load) / 1000


def _fast_tpot(load: float) -> float:
    return (4 * (1 + 0.01 * load) + 12 + 0.5 * load) / 1000 / 2.7731


def _fast_at_low_loads_noisy() -> PoolEstimator:
    """The fast pool measured only at 4 and 10 requests per replica, the lower load slower (the
    first requests of a ramp share their steps with 128 prefills): a negative slope in the data."""
    fast = PoolEstimator(30.0, "fast", stale_s=10.0)
    for i in range(12):
        load = 4.0 if i % 2 else 10.0
        tpot = 0.00875 if load == 4.0 else 0.00525
        fast.observe(Measurement(550, 0, 32, load, ttft_s=0.03, decode_s=31 * tpot), i * 0.1)
    return fast


def _choose(std: PoolEstimator, fast: PoolEstimator, std_load: float, fast_load: float) -> str:
    d = decide(FACTS, PoolView("standard", True, std_load, 500, std.snapshot(2.0)),
               PoolView("fast", True, fast_load, 500, fast.snapshot(2.0)), P, draw=0.9)
    return d.tier


def test_a_slope_fitted_below_the_physical_one_is_floored():
    fast = _fast_at_low_loads_noisy()
    std = PoolEstimator(30.0, "standard", stale_s=10.0)
    for i in range(20):  # standard measured across loads: its slope is identified
        load = 10.0 + 6 * i
        std.observe(Measurement(550, 500, 32, load, ttft_s=0.05, decode_s=31 * _std_tpot(load)),
                    1.2 + i * 0.01)
    est = fast.snapshot(2.0)
    a, b = est.tpot_beta
    assert b > 0 and b == pytest.approx(a * 0.54 / 16)  # on the floor ρ·a, not negative
    assert est.tpot_s(88) > est.tpot_s(10) > est.tpot_s(4)
    assert est.tpot_s(88) == pytest.approx(_fast_tpot(88), rel=0.25)
    assert _choose(std, fast, 40, 88) == "standard"
    assert _choose(std, fast, 100, 28) == "fast"


def _rec(ttft: float, decode: float) -> RequestRecord:
    rec = RequestRecord("r", "/v1/chat/completions", model="m", served_tier="standard",
                        outcome="ok", stream=True, ttft_s=ttft)
    rec.usage = Usage(550, 32, 500)
    rec.itl = GapTimer()
    rec.itl.tick(0.0)
    rec.itl.tick(decode)
    return rec


def test_a_pool_first_measured_during_a_ramp_learns_its_load_slope():
    """Standard gets the ramp's first 20 requests, dispatched at 0, 6, …, 114 per replica; they
    all decode in the full batch (126). Paired with their dispatch loads, the same TPOT at every
    load reads as a flat, slow pool; paired with the load they decoded at, the fit follows the
    slope's prior and the estimate matches the physics."""
    fast = _fast_at_low_loads_noisy()
    std = PoolEstimator(30.0, "standard", stale_s=10.0)
    for i in range(20):
        std.observe(measurement(_rec(0.05, 31 * _std_tpot(126)), 6.0 * i, 126.0), 1.2 + i * 0.01)
    est = std.snapshot(2.0)
    assert est.tpot_s(40) == pytest.approx(_std_tpot(40), rel=0.1)
    assert est.tpot_s(126) == pytest.approx(_std_tpot(126), rel=0.05)
    assert _choose(std, fast, 40, 88) == "standard"
    assert _choose(std, fast, 100, 28) == "fast"


def test_measurement_takes_ttft_at_dispatch_and_decode_at_finish():
    m = measurement(_rec(0.2, 1.0), 12.0, 126.0)
    assert (m.ttft_load, m.load, m.ttft_s, m.decode_s) == (12.0, 126.0, 0.2, 1.0)
    assert measurement(_rec(0.2, 1.0), None, 126.0).ttft_load is None  # then ``load``
    rec = _rec(0.2, 1.0)
    rec.usage = None
    with pytest.raises(ValueError):
        measurement(rec, None, 1.0)
