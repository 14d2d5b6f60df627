"""``loadtests/bench_race.py --quick``: every row of the race (direct, speedgate, LiteLLM;
non-streaming and streaming) is produced, with completed requests and no errors. No speed
threshold: this machine is shared. LiteLLM must install and start: when it cannot, the script
exits 3 with the reason and this test fails with it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ("direct", "speedgate", "litellm")


@pytest.mark.timeout(900)  # the first run installs litellm[proxy] into loadtests/.venv-litellm
def test_race_quick_has_every_row() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "loadtests.bench_race", "--quick", "--json", "--quiet"],
        cwd=ROOT, capture_output=True, text=True, timeout=880,
    )
    assert r.returncode != 3, f"LiteLLM could not be installed or started:\n{r.stderr[-4000:]}"
    out = f"{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    assert r.returncode == 0, f"bench_race failed ({r.returncode}):\n{out}"
    res = json.loads(r.stdout)
    modes = {row["mode"] for row in res["closed"]}
    assert modes == {"non-stream", "stream"}
    for row in res["closed"]:
        for t in TARGETS:
            assert row[t]["ok"] > 0 and row[t]["rps"] > 0, (row["mode"], t, row[t])
        assert row["speedgate_over_litellm"] is not None
    for mode in ("non-stream", "stream"):
        assert set(TARGETS) <= set(res["max_rps"][mode])
    assert {row["mode"] for row in res["rate"]} == {"non-stream", "stream"}
    for row in res["rate"]:
        for t in TARGETS:
            assert row[t] is not None and row[t]["ok"] > 0, (row["mode"], t)
    for t in TARGETS:
        assert res["itl"][t]["gaps"] > 0, t
    assert res["errors"] == {}
