"""A short headless locust run against the CPU stack (simulators + gateway): the report folder
has its files, and the TTFT/ITL the locustfile recorded agree with the simulator's timing model
(``engines.sim.perf.PerfModel`` at the stack's ``--time-scale``)."""

from __future__ import annotations

import csv
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from engines.sim.perf import PerfModel

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
USERS = 4
TIME_SCALE = 1.0
FILES = (
    "summary.md", "summary.json", "samples.jsonl", "locust.html",
    "locust_stats.csv", "locust_stats_history.csv", "locust_failures.csv",
    "ttft.png", "itl.png", "throughput.png", "errors.png", "cache_hit_by_turn.png",
)  # fmt: skip


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("loadtest")
    cmd = [
        sys.executable, "-m", "loadtests.run_loadtest",
        "--users", str(USERS), "--spawn-rate", str(USERS), "--run-time", "6",
        "--stop-timeout", "5", "--time-scale", str(TIME_SCALE), "--report-dir", str(out),
        "--", "--think-time", "0.1-0.3", "--chat-wait", "0.1-0.3", "--min-turns", "3",
        "--max-turns", "6", "--prompt-sizes", "50,300", "--max-tokens", "32",
        "--tool-tokens", "100-400",
    ]  # fmt: skip
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=150)
    assert r.returncode == 0, f"run_loadtest failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return out


@pytest.mark.timeout(180)
def test_report_files(report: Path) -> None:
    for name in FILES:
        f = report / name
        assert f.exists() and f.stat().st_size > 0, f"missing or empty: {name}"
    for png in report.glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
    summary = json.loads((report / "summary.json").read_text())
    assert summary["locust_exit_status"] == 0
    assert {"standard", "fast"} <= set(summary["tiers"]), summary["tiers"].keys()
    for t in summary["tiers"].values():
        assert t["errors"] == 0
    assert summary["cache_by_turn"], "no agent turns recorded"
    # the custom metrics are locust request events: they appear in locust's own stats
    with (report / "locust_stats.csv").open() as f:
        rows = {(r["Type"], r["Name"]) for r in csv.DictReader(f)}
    for kind in ("TTFT", "ITL", "E2E", "TOK/S"):
        for tier in ("standard", "fast"):
            assert (kind, tier) in rows, (kind, tier, sorted(rows))
    assert "![ttft.png](ttft.png)" in (report / "summary.md").read_text()


def _samples(report: Path) -> list[dict]:
    lines = (report / "samples.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines if x.strip()]


@pytest.mark.timeout(180)
def test_itl_matches_simulator_step_time(report: Path) -> None:
    """Standard: one token per decode step of ``12 + 0.1 B`` ms; fast: one chunk per
    speculative step (draft k tokens + verify). The median gap lies between the step time at
    batch 1 and at batch = all users (with slack for a shared CPU)."""
    std, fast = PerfModel(), PerfModel(num_speculative_tokens=4)
    expect = {"standard": std.decode_step_s, "fast": fast.spec_step_s}
    for tier, step in expect.items():
        gaps = [g for s in _samples(report) if s.get("ok") and s["tier"] == tier
                for g in s["itl"]]  # fmt: skip
        assert len(gaps) >= 20, (tier, len(gaps))
        med = statistics.median(gaps)
        lo, hi = 0.85 * step(1) * TIME_SCALE, 1.5 * step(USERS) * TIME_SCALE + 0.005
        msg = f"{tier}: ITL median {med * 1e3:.2f} ms not in [{lo * 1e3:.2f}, {hi * 1e3:.2f}]"
        assert lo <= med <= hi, msg


@pytest.mark.timeout(180)
def test_ttft_matches_simulator_prefill(report: Path) -> None:
    """TTFT >= the prefill of the uncached prompt tokens (a real sleep in the simulator), and
    the median excess over it stays within a few decode steps."""
    perf = PerfModel()
    excess = []
    for s in _samples(report):
        if not s.get("ok") or s.get("ttft") is None:
            continue
        uncached = s["prompt_tokens"] - (s.get("cached_tokens") or 0)
        prefill = perf.prefill_s(uncached) * TIME_SCALE
        assert s["ttft"] >= 0.9 * prefill, (s["ttft"], prefill, s)
        excess.append(s["ttft"] - prefill)
    assert len(excess) >= 10
    assert statistics.median(excess) < 0.1, f"median TTFT excess {statistics.median(excess):.3f} s"
