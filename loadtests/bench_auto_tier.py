"""The ``auto`` tier benchmark: all-standard vs all-fast vs auto, from light to
saturating load, and under a load that rises and falls.

Engines: ``--replicas`` simulated replicas per pool (``engines.sim``; standard, and speculative
with k = 4, α = 0.7: ~2× faster per request at batch 1, ~1.5× slower at batch 256, vLLM's
published measurements, see ``engines/sim/perf.py``), ``--time-scale`` stretching every engine
delay (2 shared cores cannot relay thousands of SSE events per second; the ratios stay).

Workload: closed loop of ``concurrency`` agent-like users; each runs sessions of ``--turns``
streaming turns (a shared system prompt, its own task, each turn appends the reply and a tool
result of ``--tool-chars`` characters, ``max_tokens`` = ``--max-tokens``; ``x-session-id`` per
session), back to back.

Modes, each through its own gateway (same pools): ``standard`` and ``fast`` send
``x-speedgate-tier: standard|fast``; ``auto`` sends ``x-speedgate-tier: auto`` to a gateway whose
estimates come only from its own traffic (warm across levels, as a long-running gateway is).
Sweep: for each level in ``--levels`` (users), each mode runs ``--warmup-s`` unmeasured then
``--duration-s`` measured. Varying load: users follow ``--ramp`` (users per step of
``--ramp-step-s``), e.g. light → saturating → light.

Reported per cell: requests, output tokens/s per request (mean of (completion tokens − 1) /
(last − first content event), i.e. 1 / TPOT, as vLLM's benchmark defines per-user speed), e2e
mean (s), TTFT p50/p95 (s), share served fast, errors, auto reasons. All times are client-side,
engine delays × time-scale. ``--json``: one JSON object. ``--small``: the ``make test`` version.

    python -m loadtests.bench_auto_tier            # the table in docs/benchmarks.md
    python -m loadtests.bench_auto_tier --small --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

from engines.procs import stop_processes
from engines.sim.spawn import spawn_simulator
from loadtests._common import install_loop, pct, start_gateway

MODEL = "mymodel"
MODES = ("standard", "fast", "auto")
WORDS = ("build", "test", "error", "file", "line", "passed", "failed", "module", "import", "def",
         "return", "value", "config", "assert", "trace", "call", "stack", "warning", "result")


@dataclass
class Params:
    replicas: int = 1
    levels: tuple[int, ...] = (1, 8, 32, 96, 192)
    duration_s: float = 12.0
    warmup_s: float = 5.0
    ramp: tuple[int, ...] = (4, 48, 192, 192, 48, 4)
    ramp_step_s: float = 10.0
    turns: int = 4
    tool_chars: int = 300
    max_tokens: int = 64
    time_scale: float = 3.0
    seed: int = 0


@dataclass
class Cell:
    """One measured window of one mode."""

    tps: list[float] = field(default_factory=list)  # output tokens/s per request
    ttft: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    tiers: Counter = field(default_factory=Counter)
    reasons: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)

    def summary(self) -> dict[str, Any]:
        n = len(self.e2e)
        return {
            "requests": n,
            "tok_s_per_req": round(statistics.fmean(self.tps), 2) if self.tps else None,
            "e2e_mean_s": round(statistics.fmean(self.e2e), 3) if self.e2e else None,
            "ttft_p50_s": round(pct(self.ttft, 0.5), 4) if self.ttft else None,
            "ttft_p95_s": round(pct(self.ttft, 0.95), 4) if self.ttft else None,
            "fast_share": round(self.tiers["fast"] / n, 3) if n else None,
            "errors": sum(self.errors.values()),
            "reasons": dict(self.reasons.most_common()),
        }


class User:
    """One closed-loop user: sessions of ``turns`` turns, back to back."""

    def __init__(self, i: int, p: Params) -> None:
        self.i, self.p = i, p
        self.rng = random.Random(p.seed * 100_003 + i)
        self.system = "You are a coding agent. Tools: run, read, edit. " + " ".join(
            random.Random(p.seed).choice(WORDS) for _ in range(300))
        self.n_session = 0
        self._new_session()

    def _new_session(self) -> None:
        self.n_session += 1
        self.sid = f"u{self.i}-s{self.n_session}-{self.p.seed}"
        self.turn = 0
        self.msgs: list[dict[str, Any]] = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": f"Task {self.sid}: fix issue #{self.rng.randrange(10**6)}"},
        ]

    async def step(self, http: aiohttp.ClientSession, url: str, mode: str, cell: Cell | None
                   ) -> None:
        """One turn; measured into ``cell`` unless None (warm-up)."""
        doc = {"model": MODEL, "messages": self.msgs, "stream": True,
               "max_tokens": self.p.max_tokens, "stream_options": {"include_usage": True}}
        headers = {"Content-Type": "application/json", "x-speedgate-tier": mode,
                   "x-session-id": self.sid}
        reply = await one_request(http, url, doc, headers, cell)
        tool = " ".join(self.rng.choice(WORDS) for _ in range(self.p.tool_chars // 6))
        self.msgs = [*self.msgs, {"role": "assistant", "content": reply},
                     {"role": "user", "content": f"[tool result {self.turn}] {tool}"}]
        self.turn += 1
        if self.turn >= self.p.turns:
            self._new_session()


async def one_request(
    http: aiohttp.ClientSession, url: str, doc: dict[str, Any], headers: dict[str, str],
    cell: Cell | None,
) -> str:
    """One streaming chat request; returns the reply text ("error" on failure)."""
    t0 = time.perf_counter()
    first = last = None
    text: list[str] = []
    completion = 0
    try:
        async with http.post(url + "/v1/chat/completions", data=orjson.dumps(doc),
                             headers=headers) as r:
            if r.status != 200:
                await r.read()
                if cell is not None:
                    cell.errors[f"http {r.status}"] += 1
                return "error"
            tier = r.headers.get("x-speedgate-tier", "")
            reason = r.headers.get("x-speedgate-auto-reason")
            async for line in r.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                ev = orjson.loads(line[6:])
                if ev.get("usage"):
                    completion = ev["usage"].get("completion_tokens") or 0
                for ch in ev.get("choices") or ():
                    piece = (ch.get("delta") or {}).get("content")
                    if piece:
                        now = time.perf_counter()
                        first = first or now
                        last = now
                        text.append(piece)
    except (aiohttp.ClientError, TimeoutError) as e:
        if cell is not None:
            cell.errors[type(e).__name__] += 1
        return "error"
    if cell is not None:
        cell.e2e.append(time.perf_counter() - t0)
        cell.tiers[tier] += 1
        if reason:
            cell.reasons[reason] += 1
        if first is not None:
            cell.ttft.append(first - t0)
            if last is not None and last > first and completion > 1:
                cell.tps.append((completion - 1) / (last - first))
    return "".join(text)


async def drive(
    url: str, mode: str, users: list[User], schedule: list[tuple[float, int]], measure_from: float
) -> Cell:
    """Run ``users`` in a closed loop; ``schedule``: (seconds from start, active users) steps,
    the last entry's time is the end. Requests started after ``measure_from`` s are measured."""
    cell = Cell()
    t0 = time.perf_counter()
    end = t0 + schedule[-1][0]

    def active(now: float) -> int:
        n = schedule[0][1]
        for t, k in schedule:
            if now - t0 >= t:
                n = k
        return n

    async def worker(u: User) -> None:
        if measure_from > 0:  # stagger the first requests over the warm-up
            await asyncio.sleep(u.rng.uniform(0, measure_from / 2))
        while (now := time.perf_counter()) < end:
            if u.i >= active(now):
                await asyncio.sleep(0.05)
                continue
            await u.step(http, url, mode, cell if now - t0 >= measure_from else None)

    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn,
                                     timeout=aiohttp.ClientTimeout(total=300)) as http:
        await asyncio.gather(*(worker(u) for u in users))
    return cell


def gateway_config(sims: dict[str, list[str]], seed: int) -> dict[str, Any]:
    """Both pools (``sims``: URLs per tier), auto seeded with ``seed``; port 0 (the gateway
    binds a free one and reports it)."""
    return {
        "server": {"port": 0, "access_log": False, "log_level": "warning"},
        "health": {"interval_s": 1.0},
        "models": {MODEL: {
            "auto": {"seed": seed},
            "tiers": {tier: {"served_model_name": MODEL, "endpoints": urls,
                             "routing": {"load_scrape_interval_s": 0.5}}
                      for tier, urls in sims.items()},
        }},
    }


async def reset(sims: dict[str, list[str]]) -> None:
    async with aiohttp.ClientSession() as http:
        for urls in sims.values():
            for u in urls:
                async with http.post(u + "/sim/reset") as r:
                    r.raise_for_status()


async def auto_gauges(url: str) -> dict[str, float]:
    """The auto gateway's live estimates vs measurements (``speedgate_auto_*`` gauges)."""
    from prometheus_client.parser import text_string_to_metric_families

    async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as r:
        text = await r.text()
    out = {}
    for fam in text_string_to_metric_families(text):
        if fam.name.startswith("speedgate_auto_") and fam.type == "gauge":
            for smp in fam.samples:
                key = f"{fam.name.removeprefix('speedgate_auto_')}[{smp.labels.get('pool')}]"
                out[key] = round(smp.value, 5)
    return out


async def sweep(p: Params, gws: dict[str, str], sims: dict[str, list[str]]) -> dict[str, Any]:
    out: dict[str, Any] = {"levels": {}, "ramp": {}}
    for level in p.levels:
        row = {}
        for mode in MODES:
            await reset(sims)
            users = [User(i, p) for i in range(level)]
            sched = [(0.0, level), (p.warmup_s + p.duration_s, level)]
            row[mode] = (await drive(gws[mode], mode, users, sched, p.warmup_s)).summary()
            if mode == "auto":
                row[mode]["estimates"] = await auto_gauges(gws[mode])
        out["levels"][str(level)] = row
    if p.ramp:
        for mode in MODES:
            await reset(sims)
            users = [User(i, p) for i in range(max(p.ramp))]
            sched = [(i * p.ramp_step_s, k) for i, k in enumerate(p.ramp)]
            sched.append((len(p.ramp) * p.ramp_step_s, 0))
            out["ramp"][mode] = (await drive(gws[mode], mode, users, sched, 0.0)).summary()
    return out


def run(p: Params) -> dict[str, Any]:
    """Start the simulators and two gateways (fixed tiers; auto), run the sweep and the ramp,
    stop everything."""
    procs = []
    sims: dict[str, list[str]] = {"standard": [], "fast": []}
    args = ("--output-tokens", str(p.max_tokens))
    try:
        spawned = []
        for tier, mode in (("standard", "standard"), ("fast", "speculative")):
            for i in range(p.replicas):
                sim = spawn_simulator(mode, p.time_scale, p.seed + i, args, MODEL)
                procs.append(sim.proc)
                spawned.append((tier, sim))
        for tier, sim in spawned:  # they boot in parallel; each reports the port it bound
            sims[tier].append(sim.wait_ready())
        with tempfile.TemporaryDirectory(prefix="bench-auto-") as tmp:
            gws: dict[str, str] = {}
            for name in ("fixed", "auto"):
                cfg = Path(tmp) / f"{name}.yaml"
                cfg.write_text(yaml.safe_dump(gateway_config(sims, p.seed)))
                gw = start_gateway(str(cfg), str(Path(tmp) / f"{name}.log"))
                procs.append(gw.proc)
                gws[name] = gw.wait_ready("/readyz")
            urls = {"standard": gws["fixed"], "fast": gws["fixed"], "auto": gws["auto"]}
            install_loop()
            res = asyncio.run(sweep(p, urls, sims))
            res["params"] = {k: v for k, v in vars(p).items()}
            return res
    finally:
        stop_processes(procs)


def verdict(res: dict[str, Any], margin: float = 0.05) -> dict[str, Any]:
    """Per level: auto's output tokens/s per request against the better fixed choice
    (``ok`` when within ``margin``); for the ramp, whether auto beats both."""
    out: dict[str, Any] = {}
    for level, row in res["levels"].items():
        best = max(row["standard"]["tok_s_per_req"] or 0, row["fast"]["tok_s_per_req"] or 0)
        a = row["auto"]["tok_s_per_req"] or 0
        out[level] = {"auto_vs_best": round(a / best, 3) if best else None,
                      "ok": bool(best) and a >= best * (1 - margin)}
    if res.get("ramp"):
        r = res["ramp"]
        a = r["auto"]["tok_s_per_req"] or 0
        best = max(r["standard"]["tok_s_per_req"] or 0, r["fast"]["tok_s_per_req"] or 0)
        out["ramp"] = {"auto_vs_best": round(a / best, 3) if best else None, "ok": a > best}
    return out


def print_table(res: dict[str, Any]) -> None:
    cols = ("requests", "tok_s_per_req", "e2e_mean_s", "ttft_p50_s", "ttft_p95_s", "fast_share",
            "errors")
    print(f"{'load':<10}{'mode':<10}" + "".join(f"{c:>14}" for c in cols) + "  reasons")
    rows = [(f"{k} users", v) for k, v in res["levels"].items()]
    if res.get("ramp"):
        rows.append(("ramp", res["ramp"]))
    for label, row in rows:
        for mode in MODES:
            c = row[mode]
            print(f"{label:<10}{mode:<10}" + "".join(f"{c[k]!s:>14}" for k in cols)
                  + ("  " + ",".join(f"{r}={n}" for r, n in c["reasons"].items())
                     if mode == "auto" else ""))
    print("verdict:", json.dumps(verdict(res)))


def plot(res: dict[str, Any], path: str) -> None:
    """Output tokens/s per request and TTFT p95 by load, one line per mode (PNG at ``path``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = list(res["levels"])
    x = [int(k) for k in levels]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.8))
    for mode in MODES:
        a1.plot(x, [res["levels"][k][mode]["tok_s_per_req"] for k in levels], marker="o",
                label=mode)
        a2.plot(x, [res["levels"][k][mode]["ttft_p95_s"] for k in levels], marker="o",
                label=mode)
    for ax, title in ((a1, "output tokens/s per request (higher is better)"),
                      (a2, "TTFT p95, s (lower is better)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent users (1 replica per pool)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    d = Params()
    ap.add_argument("--replicas", type=int, default=d.replicas)
    ap.add_argument("--levels", default=",".join(map(str, d.levels)), help="users per level")
    ap.add_argument("--duration-s", type=float, default=d.duration_s)
    ap.add_argument("--warmup-s", type=float, default=d.warmup_s)
    ap.add_argument("--ramp", default=",".join(map(str, d.ramp)), help="users per ramp step")
    ap.add_argument("--ramp-step-s", type=float, default=d.ramp_step_s)
    ap.add_argument("--turns", type=int, default=d.turns)
    ap.add_argument("--max-tokens", type=int, default=d.max_tokens)
    ap.add_argument("--time-scale", type=float, default=d.time_scale)
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--small", action="store_true", help="2 levels, no ramp, short windows")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--plot", default=None, help="write a PNG of the sweep to this path")
    a = ap.parse_args(argv)
    p = Params(a.replicas, tuple(int(x) for x in a.levels.split(",") if x), a.duration_s,
               a.warmup_s, tuple(int(x) for x in a.ramp.split(",") if x), a.ramp_step_s,
               a.turns, d.tool_chars, a.max_tokens, a.time_scale, a.seed)
    if a.small:
        p = small_params()
    res = run(p)
    res["verdict"] = verdict(res)
    if a.plot:
        plot(res, a.plot)
    if a.json:
        json.dump(res, sys.stdout, indent=2)
        print()
    else:
        print_table(res)


def small_params() -> Params:
    """The ``make test`` version: idle and saturated, short windows, no ramp."""
    return Params(levels=(1, 128), duration_s=4.0, warmup_s=3.0, ramp=(), max_tokens=32,
                  time_scale=4.0)


if __name__ == "__main__":
    main()
