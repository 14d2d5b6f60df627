"""Prefix-cache affinity benchmark: agent sessions against simulated replicas under
five routing policies, on the same workload in one run.

Workload: ``--sessions`` agent sessions × ``--turns`` turns. Every session shares one system
prompt, has its own task, and each turn appends the assistant's reply and a tool result of
``--tool-chars`` characters, so the context grows every turn and each turn resends all of it;
an exponential think time (mean ``--think-s``) separates turns; sessions start staggered.
Sessions send ``x-session-id`` only with ``--header`` (default: none; keyed by prefix).

Replicas: ``--replicas`` engine simulators (``engines.sim``) with a KV cache of
``--kv-blocks`` blocks of 16 tokens, sized so one replica holds its share of the sessions but
not all of them (round robin must evict), ``--time-scale`` shrinking every engine delay.

Policies (the same gateway, one pool, only ``routing`` differs; caches reset between runs):
- ``round-robin``: ``policy: round_robin``;
- ``least-loaded``: ``weights: {load: 1}``, no load bound;
- ``session-hash``: ``weights: {hash: 1}``, no load bound (production-stack's session router:
  consistent hashing on the session key);
- ``ours``: the defaults (prefix + session + load + hash, bounded load c = 1.25);
- ``oracle``: no gateway; the client sends session i to replica i mod n (perfect knowledge of
  where each session's cache is, perfectly balanced sessions): an upper bound.

Reported per policy: prefix-cache hit rate (Σ ``vllm:prefix_cache_hits`` / Σ
``vllm:prefix_cache_queries`` over replicas, tokens), TTFT p50/p95/mean and e2e p50 (seconds,
measured by the client on streaming requests; engine delays are × time-scale), and max/mean load
(requests served per replica, from ``vllm:request_success``). ``--json``: one JSON object keyed
by policy. ``--small``: a 4-replica quick run (``make test`` uses it).

    python -m loadtests.bench_affinity            # the table in docs/benchmarks.md
    python -m loadtests.bench_affinity --small --policies round-robin,ours --json
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml
from prometheus_client.parser import text_string_to_metric_families

from engines.procs import stop_processes
from engines.sim.spawn import spawn_simulator
from loadtests._common import pct, start_gateway

MODEL = "mymodel"
POLICIES = ("round-robin", "least-loaded", "session-hash", "ours", "oracle")
ROUTING: dict[str, dict[str, Any]] = {
    "round-robin": {"policy": "round_robin"},
    "least-loaded": {"weights": {"load": 1.0}, "bounded_load_c": 0},
    "session-hash": {"weights": {"hash": 1.0}, "bounded_load_c": 0},
    "ours": {},
}
WORDS = ("build", "test", "error", "file", "line", "passed", "failed", "module", "import", "def",
         "return", "value", "config", "assert", "trace", "call", "stack", "warning", "result")


@dataclass
class Params:
    replicas: int = 8
    sessions: int = 64
    turns: int = 20
    tool_chars: int = 3000
    think_s: float = 0.3
    max_tokens: int = 24
    time_scale: float = 1.0
    kv_blocks: int = 8000
    header: bool = False
    seed: int = 0


@dataclass
class Result:
    ttft: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    errors: int = 0

    def summary(self, hits: float, queries: float, per_replica: list[float]) -> dict[str, Any]:
        mean_load = statistics.fmean(per_replica) if per_replica else 0.0
        return {
            "requests": len(self.e2e), "errors": self.errors,
            "hit_rate": round(hits / queries, 4) if queries else 0.0,
            "ttft_p50_s": round(pct(self.ttft, 0.5), 4),
            "ttft_p95_s": round(pct(self.ttft, 0.95), 4),
            "ttft_mean_s": round(statistics.fmean(self.ttft), 4) if self.ttft else None,
            "e2e_p50_s": round(pct(self.e2e, 0.5), 4),
            "max_mean_load": round(max(per_replica) / mean_load, 3) if mean_load else None,
        }


def engine_counters(text: str) -> dict[str, float]:
    """Prefix-cache hits, queries and finished requests from one engine's ``/metrics``."""
    out = {"hits": 0.0, "queries": 0.0, "requests": 0.0}
    names = {"vllm:prefix_cache_hits": "hits", "vllm:prefix_cache_queries": "queries",
             "vllm:request_success": "requests"}
    for fam in text_string_to_metric_families(text):
        key = names.get(fam.name)
        if key:
            out[key] += sum(s.value for s in fam.samples if s.name.endswith("_total"))
    return out


async def scrape(http: aiohttp.ClientSession, urls: list[str]) -> list[dict[str, float]]:
    out = []
    for u in urls:
        async with http.get(u + "/metrics") as r:
            out.append(engine_counters(await r.text()))
    return out


async def one_turn(
    http: aiohttp.ClientSession, url: str, doc: dict[str, Any], headers: dict[str, str],
    res: Result,
) -> str:
    """One streaming chat request; records TTFT (first content event) and e2e; the reply."""
    t0 = time.perf_counter()
    ttft = None
    text: list[str] = []
    try:
        async with http.post(url + "/v1/chat/completions", data=orjson.dumps(doc),
                             headers=headers) as r:
            if r.status != 200:
                res.errors += 1
                await r.read()
                return "error"
            async for line in r.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                ev = orjson.loads(line[6:])
                for ch in ev.get("choices") or ():
                    piece = (ch.get("delta") or {}).get("content")
                    if piece:
                        if ttft is None:
                            ttft = time.perf_counter() - t0
                        text.append(piece)
    except (aiohttp.ClientError, TimeoutError):
        res.errors += 1
        return "error"
    res.e2e.append(time.perf_counter() - t0)
    if ttft is not None:
        res.ttft.append(ttft)
    return "".join(text)


async def session(
    i: int, p: Params, target: str, res: Result, http: aiohttp.ClientSession
) -> None:
    rng = random.Random(p.seed * 1000 + i)
    await asyncio.sleep(rng.uniform(0, 2 * p.think_s + 0.5))
    system = "You are a coding agent. Tools: run, read, edit. " + " ".join(
        random.Random(p.seed).choice(WORDS) for _ in range(300))
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": f"Task {i}: fix issue #{rng.randrange(10**6)} in repo {i}."},
    ]
    headers = {"Content-Type": "application/json"}
    if p.header:
        headers["x-session-id"] = f"bench-{p.seed}-{i}"
    for turn in range(p.turns):
        doc = {"model": MODEL, "messages": msgs, "stream": True, "max_tokens": p.max_tokens}
        reply = await one_turn(http, target, doc, headers, res)
        tool = " ".join(rng.choice(WORDS) for _ in range(p.tool_chars // 6))
        msgs = [*msgs, {"role": "assistant", "content": reply},
                {"role": "user", "content": f"[tool result {turn}] {tool}"}]
        await asyncio.sleep(rng.expovariate(1 / p.think_s) if p.think_s > 0 else 0)


async def workload(p: Params, targets: list[str]) -> Result:
    """Run every session; session i goes to ``targets[i % len(targets)]``."""
    res = Result()
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn,
                                     timeout=aiohttp.ClientTimeout(total=120)) as http:
        await asyncio.gather(*(session(i, p, targets[i % len(targets)], res, http)
                               for i in range(p.sessions)))
    return res


def gateway_config(sims: list[str], routing: dict[str, Any]) -> dict[str, Any]:
    """One pool of ``sims`` routed by ``routing``; port 0 (the gateway binds a free one and
    reports it)."""
    return {
        "server": {"port": 0, "access_log": False, "log_level": "warning"},
        "health": {"interval_s": 1.0},
        "models": {MODEL: {"tiers": {"standard": {
            "served_model_name": MODEL, "endpoints": sims,
            "routing": {"load_scrape_interval_s": 0.5, **routing},
        }}}},
    }


async def run_policy(policy: str, p: Params, sims: list[str], tmp: Path) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http:
        for u in sims:
            async with http.post(u + "/sim/reset") as r:
                r.raise_for_status()
        before = await scrape(http, sims)
    gw = None
    try:
        if policy == "oracle":
            targets = sims
        else:
            cfg_path = tmp / f"{policy}.yaml"
            cfg_path.write_text(yaml.safe_dump(gateway_config(sims, ROUTING[policy])))
            gw = start_gateway(str(cfg_path), str(tmp / f"{policy}.log"))
            targets = [gw.wait_ready("/readyz")]
        res = await workload(p, targets)
    finally:
        if gw is not None:
            stop_processes([gw.proc])
    async with aiohttp.ClientSession() as http:
        after = await scrape(http, sims)
    d = [{k: a[k] - b[k] for k in a} for a, b in zip(after, before, strict=True)]
    return res.summary(sum(x["hits"] for x in d), sum(x["queries"] for x in d),
                       [x["requests"] for x in d])


def run(p: Params, policies: list[str]) -> dict[str, dict[str, Any]]:
    """Start the simulators, run each policy on the same workload, stop everything."""
    procs = []
    sims: list[str] = []
    args = ("--time-scale", str(p.time_scale), "--num-gpu-blocks", str(p.kv_blocks),
            "--max-model-len", str(p.kv_blocks * 16), "--output-tokens", str(p.max_tokens))
    try:
        spawned = []
        for i in range(p.replicas):
            spawned.append(spawn_simulator("standard", p.time_scale, i, args, MODEL))
            procs.append(spawned[-1].proc)
        sims.extend(s.wait_ready() for s in spawned)  # they boot in parallel
        with tempfile.TemporaryDirectory(prefix="bench-affinity-") as tmp:
            return {pol: asyncio.run(run_policy(pol, p, sims, Path(tmp))) for pol in policies}
    finally:
        stop_processes(procs)


def print_table(results: dict[str, dict[str, Any]]) -> None:
    cols = ("hit_rate", "ttft_p50_s", "ttft_p95_s", "ttft_mean_s", "e2e_p50_s", "max_mean_load",
            "requests", "errors")
    print(f"{'policy':<14}" + "".join(f"{c:>15}" for c in cols))
    for pol, row in results.items():
        print(f"{pol:<14}" + "".join(f"{row[c]!s:>15}" for c in cols))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    d = Params()
    ap.add_argument("--replicas", type=int, default=d.replicas)
    ap.add_argument("--sessions", type=int, default=d.sessions)
    ap.add_argument("--turns", type=int, default=d.turns)
    ap.add_argument("--tool-chars", type=int, default=d.tool_chars)
    ap.add_argument("--think-s", type=float, default=d.think_s)
    ap.add_argument("--time-scale", type=float, default=d.time_scale)
    ap.add_argument("--kv-blocks", type=int, default=d.kv_blocks)
    ap.add_argument("--header", action="store_true", help="send x-session-id")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--small", action="store_true", help="4 replicas, 8 sessions x 6 turns")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    p = Params(a.replicas, a.sessions, a.turns, a.tool_chars, a.think_s, d.max_tokens,
               a.time_scale, a.kv_blocks, a.header)
    if a.small:
        p = Params(replicas=4, sessions=8, turns=6, think_s=0.1, kv_blocks=2000,
                   time_scale=a.time_scale, header=a.header)
    policies = [x for x in a.policies.split(",") if x]
    unknown = set(policies) - set(POLICIES)
    if unknown:
        ap.error(f"unknown policies {sorted(unknown)}")
    results = run(p, policies)
    if a.json:
        json.dump(results, sys.stdout, indent=2)
        print()
    else:
        print_table(results)


if __name__ == "__main__":
    main()
