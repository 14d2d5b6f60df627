"""The auto-tier benchmark's small version (loadtests/bench_auto_tier.py --small): idle and
saturated, all-standard / all-fast / auto. Loose margins only (2 shared cores): auto is within
25% of the better fixed choice on output tokens/s per request at both levels, and goes fast when
idle."""

import pytest

from loadtests.bench_auto_tier import run, small_params, verdict

pytestmark = pytest.mark.e2e


def test_auto_is_near_the_better_fixed_choice():
    res = run(small_params())
    for level, row in res["levels"].items():
        for mode, cell in row.items():
            assert cell["errors"] == 0 and cell["requests"] > 0, (level, mode, cell)
    v = verdict(res, margin=0.25)
    assert all(x["ok"] for x in v.values()), (v, res)
    assert res["levels"]["1"]["auto"]["fast_share"] >= 0.5, res
