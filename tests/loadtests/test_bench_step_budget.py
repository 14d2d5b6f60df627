"""``loadtests/bench_step_budget.py`` (CPU per request and per event by step, py-spy
samples against the floor) runs every cell without an error at a tiny size; its output has
every cell, step and ratio, and each cell's steps sum to its measured total. No speed
threshold: this machine is shared. The attribution rules are checked on hand-made stacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loadtests.bench_step_budget import TARGETS, find_py_spy
from loadtests.profile_steps import STEPS, Profile, split_us, step_of

ROOT = Path(__file__).resolve().parents[2]


def test_a_sample_belongs_to_its_innermost_step() -> None:
    leaf_in_json = ["run (uvicorn/server.py:1)", "handle (gateway/admit/gate.py:9)",
                    "dumps (json/__init__.py:231)"]  # fmt: skip
    assert step_of(leaf_in_json) == "admit"  # the standard library goes to its caller
    assert step_of(["handle (gateway/relay/stream.py:3)", "read (aiohttp/streams.py:5)"]) == (
        "http stack")
    assert step_of(["run (uvicorn/server.py:1)", "__call__ (gateway/app.py:7)"]) == "other"
    assert step_of(["x (gateway/protocols/openai/splice.py:2)"]) == "relay"
    assert step_of(["<module> (spin.py:1)"]) == "other"


def test_profile_counts_raw_lines_and_splits_the_total() -> None:
    prof = Profile()
    prof.add_raw('process 1:"python";f (gateway/routing/keys.py:3) 3\n'
                 "f (gateway/account.py:1);g (asyncio/events.py:2) 1\n\n")
    assert prof.total == 4
    assert prof.steps == {"route": 3, "http stack": 1}
    parts = split_us(100.0, prof)
    assert set(parts) == set(STEPS) and parts["route"] == 75.0 and parts["http stack"] == 25.0
    assert prof.top(1)[0] == {"function": "f (gateway/routing/keys.py)", "step": "route",
                              "self_pct": 75.0, "cum_pct": 75.0}  # fmt: skip


@pytest.mark.e2e
@pytest.mark.timeout(200)
def test_step_budget_tiny_run_has_every_figure() -> None:
    if find_py_spy() is None:
        pytest.skip("py-spy is not installed (the dev extras install it)")
    r = subprocess.run(
        [sys.executable, "-m", "loadtests.bench_step_budget", "--chunks", "5",
         "--concurrency", "4", "--paced-concurrency", "4", "--duration", "0.4",
         "--warmup", "0.1", "--repeats", "1", "--top", "5", "--json", "--quiet"],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert r.returncode == 0, f"{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    res = json.loads(r.stdout)
    assert res["errors"] == {}
    cells = res["summary"]["cells"]
    assert set(cells) == {"burst stream", "burst non-stream", "paced stream",
                          "paced non-stream"}  # fmt: skip
    for name, targets in cells.items():
        assert set(targets) == {"floor", "speedgate"}, name
        for c in targets.values():
            assert c["requests"] > 0 and c["us_per_request"] > 0 and c["samples"] > 0
            steps = c["steps_us_per_request"]
            assert list(steps) == list(STEPS)
            assert sum(steps.values()) == pytest.approx(c["us_per_request"], abs=1.0)
            if c["events_per_request"]:
                assert sum(c["steps_us_per_event"].values()) == pytest.approx(
                    c["us_per_event"], abs=0.1)
            assert c["top_cumulative"] and c["top_self"]
            for row in c["top_self"]:
                assert 0 < row["self_pct"] <= row["cum_pct"] <= 100
        # the floor is the HTTP stack alone: none of its samples is a gateway step
        floor = targets["floor"]["steps_us_per_request"]
        assert all(floor[s] == 0 for s in STEPS if s not in ("http stack", "other"))
    assert set(res["summary"]["ratios"]["speedgate"]) == set(TARGETS)
    for v in res["summary"]["ratios"]["speedgate"].values():
        assert v["ratio"] > 0 and v["met"] == (v["ratio"] <= v["limit"])
