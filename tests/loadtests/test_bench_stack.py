"""``loadtests/bench_stack.py`` (the gateway and its floor on uvicorn and on granian) runs
every cell without an error and reports each target's CPU per request. Granian is not a
dependency (it was measured, not adopted): skipped where it is not installed. No speed
threshold: this machine is shared."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(200)
def test_stack_quick_has_every_figure() -> None:
    if not (Path(sys.executable).parent / "granian").exists():
        pytest.skip("granian is not installed (pip install granian)")
    r = subprocess.run(
        [sys.executable, "-m", "loadtests.bench_stack", "--chunks", "5", "--concurrency", "4",
         "--duration", "0.4", "--warmup", "0.1", "--repeats", "1", "--json", "--quiet"],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert r.returncode == 0, f"{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    res = json.loads(r.stdout)
    assert res["errors"] == {}
    targets = {"floor uvicorn", "floor granian", "speedgate uvicorn", "speedgate granian"}
    for kind in ("non-stream", "stream"):
        assert set(res["summary"][kind]) == targets
        for fig in res["summary"][kind].values():
            assert fig["us_per_request"] > 0 and fig["p99_ms"] > 0
