"""``loadtests/bench_relay_events.py`` (paced streams: CPU per relayed event) runs every cell
without an error and reports the figures for the floor and this gateway. No speed threshold:
this machine is shared."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(200)
def test_relay_events_quick_has_every_figure() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "loadtests.bench_relay_events", "--chunks", "10",
         "--concurrency", "4", "--duration", "0.5", "--warmup", "0.1", "--repeats", "1",
         "--json", "--quiet"],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
    )
    assert r.returncode == 0, f"{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    res = json.loads(r.stdout)
    assert res["errors"] == {}
    summary = res["summary"]
    assert set(summary["stream"]) == {"floor", "speedgate"}
    assert set(summary["non-stream"]) == {"speedgate"}  # the floor asks for JSON: no events
    for kind in summary.values():
        for fig in kind.values():
            assert fig["requests"] > 0 and fig["us_per_event"] > 0 and fig["us_per_request"] > 0
