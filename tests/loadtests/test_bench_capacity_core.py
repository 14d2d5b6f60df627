"""``loadtests/bench_capacity_core.py --quick``: every target (the raw engine direct, the HTTP
stack's floor proxy, this gateway, this gateway with two workers) answers every cell of both
kinds without an error, and the derived figures exist: CPU per request and per event, GC
counters (this gateway exports them), RSS at start and per open stream.
No speed threshold: this machine is shared."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_capacity_core_quick_has_every_figure() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "loadtests.bench_capacity_core", "--quick", "--json", "--quiet",
         "--no-litellm", "--two-workers", "--floor"],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
    )
    assert r.returncode == 0, f"{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    res = json.loads(r.stdout)
    targets = ("direct", "floor", "speedgate", "speedgate-2w")
    assert res["settings"]["targets"] == list(targets)
    assert res["errors"] == {}
    cells = {(c["kind"], c["concurrency"], c["target"]) for c in res["cells"] if c["ok"] > 0}
    assert cells == {(k, c, t) for k in ("non-stream", "stream") for c in (1, 32)
                     for t in targets}
    for t in ("speedgate", "speedgate-2w"):
        ns, st = res["summary"][t]["non-stream"], res["summary"][t]["stream"]
        assert ns["cpu_us_per_request"] > 0 and st["cpu_us_per_event"] > 0
        assert ns["added_c1_p50_ms"] is not None and st["tail"]
        assert set(st["gc_collections"]) == {"0", "1", "2"}
        rss = res["rss"][t]
        assert rss["start_kib"] > 0 and rss["streams"] == res["settings"]["hold"]
    floor = res["summary"]["floor"]  # the HTTP stack alone: measured like the gateway
    assert floor["non-stream"]["cpu_us_per_request"] > 0
    assert floor["stream"]["added_c1_p50_ms"] is not None
    assert res["rss"]["speedgate-2w"]["processes"] >= 3  # the supervisor and two workers
