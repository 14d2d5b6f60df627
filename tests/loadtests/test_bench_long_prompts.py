"""``loadtests/bench_long_prompts.py --quick`` (direct, floor, speedgate; smg is left out here:
it is installed from the network): every figure of every target is present and finite, no
request failed, and every process the benchmark started is gone afterwards. No speed
threshold: this machine is shared."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ("direct", "floor", "speedgate")


def numbers(doc: Any, where: str = "") -> list[tuple[str, Any]]:
    """Every leaf of ``doc`` with its path (errors and turn counts included)."""
    if isinstance(doc, dict):
        return [x for k, v in doc.items() for x in numbers(v, f"{where}/{k}")]
    return [(where, doc)]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.timeout(120)
def test_long_prompts_quick_has_every_figure() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "loadtests.bench_long_prompts", "--quick", "--json", "--quiet",
         "--targets", ",".join(TARGETS)],
        cwd=ROOT, capture_output=True, text=True, timeout=110,
    )
    assert r.returncode == 0, f"bench_long_prompts failed ({r.returncode}):\n{r.stderr[-4000:]}"
    res = json.loads(r.stdout)
    assert list(res["targets"]) == list(TARGETS)
    assert res["errors"] == {} and res["skipped"] == {}
    for t in TARGETS:
        x = res["targets"][t]
        assert {"alone", "long", "b2b", "rate", "added_largest_ms"} <= set(x), t
        for key in ("p50_ms", "p99_ms", "max_ms"):
            assert x["alone"][key] > 0 and x["b2b"]["small"][key] > 0, (t, key)
            assert x["rate"]["small"][key] > 0, (t, key)
        for key in ("turns", "p50_ms", "largest_p50_ms", "mb", "cpu_ms_per_turn", "cpu_ms_per_mb"):
            assert x["long"][key] > 0 or key.startswith("cpu"), (t, key, x["long"])
        for phase in ("b2b", "rate"):
            assert x[phase]["long"]["largest_turns"] > 0, (t, phase)
        for path, v in numbers(x):
            if path.startswith("/errors"):
                continue
            assert isinstance(v, (int, float)) and math.isfinite(v), (t, path, v)
    assert set(res["ratios"]) == {"floor/direct", "speedgate/direct"}
    for path, v in numbers(res["ratios"]):
        assert math.isfinite(v), (path, v)
    assert res["pids"] and all(gone(p) for p in res["pids"]), res["pids"]
