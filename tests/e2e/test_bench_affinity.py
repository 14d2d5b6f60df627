"""The affinity benchmark's small version (loadtests/bench_affinity.py --small): on the same
workload, prefix-cache affinity beats round robin on the engines' prefix-cache hit rate."""

import pytest

from loadtests.bench_affinity import Params, run

pytestmark = pytest.mark.e2e


def test_ours_beats_round_robin_on_hit_rate():
    p = Params(replicas=4, sessions=8, turns=5, think_s=0.05, kv_blocks=2000, time_scale=0.05)
    res = run(p, ["round-robin", "ours"])
    assert res["round-robin"]["errors"] == 0 and res["ours"]["errors"] == 0
    assert res["ours"]["hit_rate"] > res["round-robin"]["hit_rate"] + 0.1, res
