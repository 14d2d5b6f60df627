"""``loadtests/bench_stack.py`` (the gateway and its floor on uvicorn + aiohttp as shipped,
beside the candidate stacks: granian, the pyreqwest client) runs every cell without an error
and reports each target's CPU per request. Neither candidate is a dependency (both measured,
not adopted): each case is skipped where its package is not installed. No speed threshold:
this machine is shared."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loadtests.bench_stack import available_stacks

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("stack", ["granian", "pyreqwest"])
def test_stack_quick_has_every_figure(stack: str) -> None:
    if stack not in available_stacks():
        pytest.skip(f"{stack} is not installed (pip install {stack})")
    r = subprocess.run(
        [sys.executable, "-m", "loadtests.bench_stack", "--stacks", stack, "--chunks", "5",
         "--concurrency", "4", "--duration", "0.4", "--warmup", "0.1", "--repeats", "1",
         "--json", "--quiet"],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert r.returncode == 0, f"{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    res = json.loads(r.stdout)
    assert res["errors"] == {}
    targets = {"floor uvicorn", f"floor {stack}", "speedgate uvicorn", f"speedgate {stack}"}
    for kind in ("non-stream", "stream"):
        assert set(res["summary"][kind]) == targets
        for fig in res["summary"][kind].values():
            assert fig["us_per_request"] > 0 and fig["p99_ms"] > 0


def test_missing_stack_exits_2() -> None:
    absent = [s for s in ("granian", "pyreqwest") if s not in available_stacks()]
    if not absent:
        pytest.skip("both candidates are installed here")
    r = subprocess.run([sys.executable, "-m", "loadtests.bench_stack", "--stacks", absent[0]],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2 and "not installed" in r.stderr
