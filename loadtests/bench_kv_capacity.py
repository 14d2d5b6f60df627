"""Capacity-aware placement on vs off: long agent sessions on replicas of different KV size.

A bounded, scaled-down form of the 1M-token workload. Two simulated replicas run with
``--preemption`` (vLLM V1 recompute): a large one (``--big-tokens`` of KV) and a small one
(``--small-tokens``). ``--sessions`` agent sessions grow turn by turn by ``--step-words`` words,
each turn streamed with ``max_tokens=--max-tokens``, beside short interactive requests. Two
runs on fresh replicas share the workload: "on" uses the default routing weights (headroom
scorer 1.0) and "off" sets the headroom weight to 0. Fit-at-admission is active in both.

``--full``: the issue's size on the time-scaled simulator: 4 replicas of 1.2M KV tokens each
(``max_model_len`` 1.2M), 20 sessions growing from 50k to 1M words (one simulator token a word)
over 5 turns, beside short interactive requests; bounded by ``--timeout-s`` per request.

Per run it reports:
- requests and errors, and hangs (no answer within ``--timeout-s``);
- engine preemptions (Δ ``vllm:num_preemptions`` over the replicas) and the tokens they make
  the engines prefill again (Δ ``sim_recomputed_tokens``: prompt + output so far);
- prefilled tokens: prompt tokens the engines computed rather than found cached (Δ
  ``vllm:prefix_cache_queries`` − ``vllm:prefix_cache_hits``), moves' re-prefills included;
- turns moved and waited for KV room (``kv_placement=move|wait`` in the access log) and the
  sessions moved at least once;
- TTFT p50/p95 of the session and interactive classes.

Usage: ``python -m loadtests.bench_kv_capacity [--full] [--json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from engines.procs import stop_processes
from engines.sim.spawn import spawn_simulator
from gateway.upstream.load_scraper import (
    PREEMPTIONS,
    PREFIX_HITS,
    PREFIX_QUERIES,
    parse_engine_metrics,
)
from loadtests._common import pct, start_gateway

MODEL = "mymodel"
OFF_WEIGHTS = {"prefix": 3.0, "session": 2.0, "load": 1.0, "hash": 0.25, "headroom": 0.0}


@dataclass
class Params:
    """The workload: ``sessions`` growing ``step_words`` per turn for ``turns`` turns."""

    sessions: int = 6
    turns: int = 5
    step_words: int = 1400
    start_words: int = 0  # words of turn 1 (0: step_words); turn t has start + (t-1) × step
    max_tokens: int = 2000
    interactive: int = 5
    big_tokens: int = 40960
    small_tokens: int = 16384
    replicas: int = 0  # 0: one of big_tokens and one of small_tokens; n: n of big_tokens
    max_model_len: int = 16384
    time_scale: float = 0.05
    timeout_s: float = 60.0

    @classmethod
    def full(cls) -> Params:
        """The issue's size: 4 replicas × 1.2M tokens, 20 sessions 50k → 1M over 5 turns."""
        return cls(sessions=20, turns=5, start_words=50_000, step_words=237_500,
                   max_tokens=500, interactive=10, big_tokens=1_200_000, replicas=4,
                   max_model_len=1_200_000, time_scale=0.002, timeout_s=240.0)

    def words(self, turn: int) -> int:
        """Prompt words of ``turn`` (1-based)."""
        return (self.start_words or self.step_words) + (turn - 1) * self.step_words

    def kv_sizes(self) -> list[int]:
        """KV tokens of each replica."""
        if self.replicas:
            return [self.big_tokens] * self.replicas
        return [self.big_tokens, self.small_tokens]


async def _stream(http: aiohttp.ClientSession, url: str, words: int, max_tokens: int,
                  session: str, timeout_s: float) -> tuple[str, float | None]:
    """One streamed completion: (outcome ``ok`` | ``error`` | ``hang``, TTFT s or None)."""
    body = {"model": MODEL, "prompt": f"{session} " + "word " * words, "stream": True,
            "max_tokens": max_tokens, "ignore_eos": True}
    t0 = time.monotonic()
    ttft = None
    try:
        async with asyncio.timeout(timeout_s):
            async with http.post(url + "/v1/completions", json=body,
                                 headers={"x-session-id": session}) as r:
                if r.status != 200:
                    await r.read()
                    return "error", None
                async for line in r.content:
                    if ttft is None and line.startswith(b"data: {") and b'"text"' in line:
                        ttft = time.monotonic() - t0
        return "ok", ttft
    except TimeoutError:
        return "hang", None
    except aiohttp.ClientError:
        return "error", None


async def _counters(http: aiohttp.ClientSession, sims: list[str]) -> dict[str, float]:
    """Preemptions, recomputed tokens and prefilled (uncached) prompt tokens, summed over
    ``sims``."""
    out = {"preemptions": 0.0, "recomputed_tokens": 0.0, "prefilled_tokens": 0.0}
    for u in sims:
        async with http.get(u + "/metrics") as r:
            text = await r.text()
        values = parse_engine_metrics(text)
        out["preemptions"] += values.get(PREEMPTIONS, 0.0)
        out["prefilled_tokens"] += values.get(PREFIX_QUERIES, 0.0) - values.get(PREFIX_HITS, 0.0)
        for fam in text_string_to_metric_families(text):
            if fam.name == "sim_recomputed_tokens":
                out["recomputed_tokens"] += sum(s.value for s in fam.samples
                                                if s.name.endswith("_total"))
    return out


async def workload(p: Params, gw: str, sims: list[str]) -> dict[str, Any]:
    """Run the turns against the gateway at ``gw``; the figures of one run."""
    ttft: dict[str, list[float]] = {"session": [], "interactive": []}
    outcomes: dict[str, int] = {"ok": 0, "error": 0, "hang": 0}
    async with aiohttp.ClientSession() as http:
        before = await _counters(http, sims)
        for turn in range(1, p.turns + 1):
            jobs = [_stream(http, gw, p.words(turn), p.max_tokens, f"agent-{i}",
                            p.timeout_s) for i in range(p.sessions)]
            jobs += [_stream(http, gw, 50, 16, f"chat-{turn}-{i}", p.timeout_s)
                     for i in range(p.interactive)]
            results = await asyncio.gather(*jobs)
            for i, (outcome, t) in enumerate(results):
                outcomes[outcome] += 1
                if t is not None:
                    ttft["session" if i < p.sessions else "interactive"].append(t)
        after = await _counters(http, sims)
    return {
        "requests": sum(outcomes.values()), **outcomes,
        **{k: int(after[k] - before[k]) for k in after},
        **{f"ttft_{c}_{q}_s": round(pct(v, x), 4) for c, v in ttft.items()
           for q, x in (("p50", 0.5), ("p95", 0.95))},
    }


def run_mode(p: Params, mode: str, tmp: Path) -> dict[str, Any]:
    """Fresh replicas and a gateway for ``mode`` (``on`` | ``off``); the run's figures."""
    procs = []
    try:
        spawned = []
        for i, tokens in enumerate(p.kv_sizes()):
            args = ("--time-scale", str(p.time_scale), "--kv-cache-tokens", str(tokens),
                    "--max-model-len", str(p.max_model_len), "--preemption")
            spawned.append(spawn_simulator("standard", p.time_scale, i, args, MODEL))
            procs.append(spawned[-1].proc)
        sims = [s.wait_ready() for s in spawned]
        routing: dict[str, Any] = {"load_scrape_interval_s": 0.2}
        if mode == "off":
            routing["weights"] = OFF_WEIGHTS
        cfg = {"server": {"port": 0}, "health": {"interval_s": 0.5, "timeout_s": 1},
               "models": {MODEL: {"tiers": {"standard": {
                   "served_model_name": MODEL, "endpoints": sims, "routing": routing,
                   "timeouts": {"connect_s": 2, "ttft_s": p.timeout_s, "stall_s": p.timeout_s,
                                "total_s": p.timeout_s}}}}}}
        cfg_path, log_path = tmp / f"{mode}.yaml", tmp / f"{mode}.log"
        cfg_path.write_text(yaml.safe_dump(cfg))
        gw = start_gateway(str(cfg_path), str(log_path))
        procs.append(gw.proc)
        url = gw.wait_ready("/readyz")
        time.sleep(1.0)  # a few scrapes: the gateway knows each replica's KV pool
        res = asyncio.run(workload(p, url, sims))
        log = log_path.read_text(errors="replace")
        moved = [line for line in log.splitlines() if "kv_placement=move" in line]
        res["moved"] = len(moved)
        res["waited"] = log.count("kv_placement=wait")
        res["sessions_moved"] = len({m.group(1) for line in moved
                                     if (m := re.search(r"session_id=(\S+)", line))})
        return res
    finally:
        stop_processes(procs)


def main(argv: list[str] | None = None) -> None:
    """Run "on" then "off" and print the figures (a table, or JSON with ``--json``)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ints = ("sessions", "turns", "step_words", "start_words", "max_tokens", "interactive",
            "big_tokens", "small_tokens", "replicas", "max_model_len")
    for name in ints:
        ap.add_argument("--" + name.replace("_", "-"), type=int)
    ap.add_argument("--time-scale", type=float)
    ap.add_argument("--timeout-s", type=float)
    ap.add_argument("--full", action="store_true", help="the issue's size (Params.full)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    base = Params.full() if a.full else Params()
    given = {k: v for k, v in vars(a).items() if k not in ("json", "full") and v is not None}
    p = replace(base, **given)
    with tempfile.TemporaryDirectory(prefix="bench-kv-") as tmp:
        results = {mode: run_mode(p, mode, Path(tmp)) for mode in ("on", "off")}
    if a.json:
        print(json.dumps(results, indent=2))
        return
    cols = list(results["on"])
    print(f"{'placement':<10}" + "".join(f"{c:>24}" for c in cols))
    for mode, row in results.items():
        print(f"{mode:<10}" + "".join(f"{row[c]!s:>24}" for c in cols))


if __name__ == "__main__":
    main()
