"""Capacity-aware placement on vs off: long agent sessions on replicas of different KV size.

A bounded, scaled-down form of the 1M-token workload. Two simulated replicas run with
``--preemption`` (vLLM V1 recompute): a large one (``--big-tokens`` of KV) and a small one
(``--small-tokens``). ``--sessions`` agent sessions grow turn by turn by ``--step-words`` words,
each turn streamed with ``max_tokens=--max-tokens``, beside short interactive requests. Two
runs on fresh replicas share the workload: "on" uses the default routing weights (headroom
scorer 1.0) and "off" sets the headroom weight to 0. Fit-at-admission is active in both.

Per run it reports:
- requests and errors, and hangs (no answer within ``--timeout-s``);
- engine preemptions (Δ ``vllm:num_preemptions`` over both replicas);
- sessions moved for KV room (``kv_placement=move`` in the access log);
- TTFT p50/p95 of the session and interactive classes.

Usage: ``python -m loadtests.bench_kv_capacity [--json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from engines.procs import stop_processes
from engines.sim.spawn import spawn_simulator
from gateway.upstream.load_scraper import PREEMPTIONS, parse_engine_metrics
from loadtests._common import pct, start_gateway

MODEL = "mymodel"
OFF_WEIGHTS = {"prefix": 3.0, "session": 2.0, "load": 1.0, "hash": 0.25, "headroom": 0.0}


@dataclass
class Params:
    """The workload: ``sessions`` growing ``step_words`` per turn for ``turns`` turns."""

    sessions: int = 6
    turns: int = 5
    step_words: int = 1400
    max_tokens: int = 2000
    interactive: int = 5
    big_tokens: int = 40960
    small_tokens: int = 16384
    max_model_len: int = 16384
    time_scale: float = 0.05
    timeout_s: float = 60.0


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


async def _preemptions(http: aiohttp.ClientSession, sims: list[str]) -> float:
    total = 0.0
    for u in sims:
        async with http.get(u + "/metrics") as r:
            total += parse_engine_metrics(await r.text()).get(PREEMPTIONS, 0.0)
    return total


async def workload(p: Params, gw: str, sims: list[str]) -> dict[str, Any]:
    """Run the turns against the gateway at ``gw``; the figures of one run."""
    ttft: dict[str, list[float]] = {"session": [], "interactive": []}
    outcomes: dict[str, int] = {"ok": 0, "error": 0, "hang": 0}
    async with aiohttp.ClientSession() as http:
        before = await _preemptions(http, sims)
        for turn in range(1, p.turns + 1):
            jobs = [_stream(http, gw, p.step_words * turn, p.max_tokens, f"agent-{i}",
                            p.timeout_s) for i in range(p.sessions)]
            jobs += [_stream(http, gw, 50, 16, f"chat-{turn}-{i}", p.timeout_s)
                     for i in range(p.interactive)]
            results = await asyncio.gather(*jobs)
            for i, (outcome, t) in enumerate(results):
                outcomes[outcome] += 1
                if t is not None:
                    ttft["session" if i < p.sessions else "interactive"].append(t)
        preempted = await _preemptions(http, sims) - before
    return {
        "requests": sum(outcomes.values()), **outcomes, "preemptions": int(preempted),
        **{f"ttft_{c}_{q}_s": round(pct(v, x), 4) for c, v in ttft.items()
           for q, x in (("p50", 0.5), ("p95", 0.95))},
    }


def run_mode(p: Params, mode: str, tmp: Path) -> dict[str, Any]:
    """Fresh replicas and a gateway for ``mode`` (``on`` | ``off``); the run's figures."""
    procs = []
    try:
        spawned = []
        for i, tokens in enumerate((p.big_tokens, p.small_tokens)):
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
        res["moved"] = log_path.read_text(errors="replace").count("kv_placement=move")
        return res
    finally:
        stop_processes(procs)


def main(argv: list[str] | None = None) -> None:
    """Run "on" then "off" and print the figures (a table, or JSON with ``--json``)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    d = Params()
    for name in ("sessions", "turns", "step_words", "max_tokens", "interactive", "big_tokens",
                 "small_tokens", "max_model_len"):
        ap.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(d, name))
    ap.add_argument("--time-scale", type=float, default=d.time_scale)
    ap.add_argument("--timeout-s", type=float, default=d.timeout_s)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    p = Params(**{k: v for k, v in vars(a).items() if k != "json"})
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
