"""Capacity per core: what one gateway core relays, against a raw engine that costs ~nothing.

Setup: a raw zero-delay engine (``loadtests.raw_engine``: pre-serialised answers,
``--chunks`` content chunks per stream, not the simulator, which is heavier than the gateway)
and this process's closed-loop load generator share one core; the gateway (one worker unless
``--workers``) has the other to itself (``os.sched_setaffinity``, when there are two or more
CPUs; ``--no-pin`` turns it off). Targets, measured side by side in one run, cell by cell:

- ``direct``: the engine itself (the floor);
- ``speedgate``: the gateway of this checkout;
- ``base``: the gateway of another checkout (``--base DIR``, e.g. ``git worktree add DIR
  <commit>``): before/after figures from one run;
- ``speedgate-2w``: the same gateway with ``server.workers: 2`` on every CPU
  (``--two-workers``; not pinned: what a user of this machine gets from a second worker);
- ``floor``: ``loadtests.floor_proxy``, a pass-through proxy on the gateway's HTTP stack
  (uvicorn, uvloop, httptools, aiohttp) doing nothing else, pinned like the gateway
  (``--floor``): what the stack costs, apart from the gateway's own steps;
- ``litellm``: LiteLLM's proxy as the reference row, when ``--litellm-venv`` holds one
  (``loadtests/bench_race.py`` creates it); ``--no-litellm`` skips it.

For non-streaming and streaming chat requests at each ``--concurrency``: req/s, p50/p99
latency. Derived per target: max req/s; req/s at p99 ≤ 1 / 5 / 10 ms (the best cell meeting
it); latency added to ``direct`` at c=1 (p50, p99); p99/p50 per concurrency; gateway CPU
(user + system, its worker processes included) per request and per relayed event (a stream
relays ``chunks + 1`` events, ``[DONE]`` included) over the cells at c ≥ 32; cyclic GC
collections and pauses during the cells (the gateway's ``speedgate_process_gc_*`` metrics;
absent for a base without them; with two workers, those of whichever worker answers each
scrape); resident memory at start (before any request) and per open
stream (``--hold`` streams held open by the engine, RSS before and while open).

Run::

    .venv/bin/python -m loadtests.bench_capacity_core              # ~2 minutes
    .venv/bin/python -m loadtests.bench_capacity_core --base /tmp/sg-base --json
    .venv/bin/python -m loadtests.bench_capacity_core --quick      # a few seconds per target

Exit status 1 when any request failed (every failure is counted by kind in ``errors``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psutil
import yaml

from loadtests._common import (
    Cell,
    Server,
    aiohttp_request,
    chat_body,
    closed_loop,
    install_loop,
    new_session,
    raise_on_sigterm,
    start_floor_proxy,
    start_gateway,
    start_raw_engine,
    stop_processes,
)
from loadtests.bench_race import DEFAULT_VENV, LITELLM_KEY, MODEL, LiteLLMError, start_litellm
from loadtests.capacity_report import KINDS, merge_rounds, print_report, summarize

SERVED = "raw-engine-model"  # the engine's name: the gateway rewrites it to MODEL on the way


def tree(pid: int) -> list[psutil.Process]:
    """``pid`` and its children (uvicorn workers)."""
    p = psutil.Process(pid)
    return [p, *p.children(recursive=True)]


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its children."""
    return sum(sum(x.cpu_times()[:2]) for x in tree(pid))


def tree_rss_kib(pid: int) -> float:
    """Resident memory of ``pid`` and its children, KiB."""
    return sum(x.memory_info().rss for x in tree(pid)) / 1024


async def gc_counters(session: aiohttp.ClientSession, url: str) -> dict[str, float] | None:
    """The gateway's ``speedgate_process_gc_*`` samples (None when it exports none)."""
    try:
        async with session.get(url + "/metrics") as r:
            text = await r.text()
    except aiohttp.ClientError:
        return None
    out = {}
    for line in text.splitlines():
        if line.startswith("speedgate_process_gc_") and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out or None


def gc_delta(before: dict[str, float] | None, after: dict[str, float] | None) -> dict | None:
    if before is None or after is None:
        return None
    runs = {g: after.get(f'speedgate_process_gc_collections_total{{generation="{g}"}}', 0)
            - before.get(f'speedgate_process_gc_collections_total{{generation="{g}"}}', 0)
            for g in "012"}  # fmt: skip
    pause = sum(after.get(f'speedgate_process_gc_pause_seconds_total{{generation="{g}"}}', 0)
                - before.get(f'speedgate_process_gc_pause_seconds_total{{generation="{g}"}}', 0)
                for g in "012")  # fmt: skip
    freed = sum(after.get(f'speedgate_process_gc_collected_objects_total{{generation="{g}"}}', 0)
                - before.get(f'speedgate_process_gc_collected_objects_total{{generation="{g}"}}', 0)
                for g in "012")  # fmt: skip
    return {"collections": runs, "pause_ms": round(pause * 1e3, 3), "collected": freed,
            "max_pause_ms": round(after.get("speedgate_process_gc_pause_max_seconds", 0) * 1e3, 3)}


def gateway_config(engine_url: str, workers: int = 1) -> dict[str, Any]:
    """The benchmarks' gateway config: one standard pool of the engine at ``engine_url``
    (served as ``SERVED``, asked for as ``MODEL``), ``workers`` processes, no access log,
    health probes every 2 s, timeouts far above any cell's (seconds)."""
    return {
        "server": {"host": "127.0.0.1", "port": 0, "workers": workers, "log_level": "warning",
                   "access_log": False},
        "health": {"enabled": True, "interval_s": 2, "timeout_s": 1},
        "models": {MODEL: {"tiers": {"standard": {
            "served_model_name": SERVED, "endpoints": [engine_url],
            "timeouts": {"connect_s": 5, "ttft_s": 60, "stall_s": 30, "total_s": 120}}}}},
    }  # fmt: skip


class Setup:
    """The engine, the gateways and LiteLLM, started and stopped together."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.tmp = tempfile.TemporaryDirectory(prefix="speedgate-core-")
        self.procs: list[Any] = []
        self.urls: dict[str, str] = {}
        self.pids: dict[str, int] = {}
        self.rss_start: dict[str, float] = {}
        self.server_cpus: set[int] | None = None
        self.loadgen_cpus: set[int] | None = None

    def start(self) -> None:
        a = self.args
        cpus = sorted(os.sched_getaffinity(0))
        if a.pin and len(cpus) >= 2:
            self.server_cpus, self.loadgen_cpus = {cpus[0]}, set(cpus[1:])
            os.sched_setaffinity(0, self.loadgen_cpus)
        engine = start_raw_engine(SERVED, a.chunks, self.loadgen_cpus)
        self.procs.append(engine.proc)
        self.urls["direct"] = engine.wait_ready("/health")
        cfg_path = Path(self.tmp.name) / "gateway.yaml"
        cfg_path.write_text(yaml.safe_dump(gateway_config(self.urls["direct"], a.workers)))
        gateways: dict[str, tuple[str | None, Path, set[int] | None]] = {
            "speedgate": (None, cfg_path, self.server_cpus)}
        if a.base:
            gateways["base"] = (a.base, cfg_path, self.server_cpus)
        if a.two_workers:  # the same gateway with 2 workers on every CPU (not pinned)
            cfg2 = Path(self.tmp.name) / "gateway-2w.yaml"
            doc = yaml.safe_load(cfg_path.read_text())
            doc["server"]["workers"] = 2
            cfg2.write_text(yaml.safe_dump(doc))
            gateways["speedgate-2w"] = (None, cfg2, None)
        started: dict[str, Server] = {}
        for name, (source, cfg, cpus) in gateways.items():
            log = str(Path(self.tmp.name) / f"{name}.log")
            srv = start_gateway(str(cfg), log, cpus=cpus,
                                source=str(Path(source).resolve()) if source else None)
            self.procs.append(srv.proc)
            started[name] = srv
        for name, srv in started.items():
            try:
                self.urls[name] = srv.wait_ready("/readyz", timeout_s=60)
            except RuntimeError as e:
                log = (Path(self.tmp.name) / f"{name}.log").read_text(errors="replace")
                raise RuntimeError(f"{name} did not start: {e}\n{log[-3000:]}") from None
            self.pids[name] = srv.pid
        if a.floor:  # the HTTP stack alone, on the gateway's core
            floor = start_floor_proxy(self.urls["direct"], self.server_cpus)
            self.procs.append(floor.proc)
            self.urls["floor"] = floor.wait_ready("/readyz")
            self.pids["floor"] = floor.pid
        if a.litellm and (Path(a.litellm_venv) / "bin" / "litellm").exists():
            proc, url = start_litellm(
                Path(a.litellm_venv), self.urls["direct"], Path(self.tmp.name),
                Path(self.tmp.name) / "litellm.log", cpus=self.server_cpus, workers=a.workers,
                progress=lambda text: progress(a, text), procs=self.procs)
            self.urls["litellm"], self.pids["litellm"] = url, proc.pid
        time.sleep(0.5)  # the workers' start-up settles (a first health probe)
        for name, pid in self.pids.items():
            self.rss_start[name] = tree_rss_kib(pid)

    def stop(self) -> None:
        stop_processes(self.procs)
        self.tmp.cleanup()

    def targets(self) -> list[str]:
        order = ("direct", "floor", "speedgate", "base", "speedgate-2w", "litellm")
        return [t for t in order if t in self.urls]

    def headers(self, target: str) -> dict[str, str] | None:
        return {"Authorization": f"Bearer {LITELLM_KEY}"} if target == "litellm" else None


def progress(args: argparse.Namespace, text: str) -> None:
    if not args.quiet:
        print(text, file=sys.stderr, flush=True)


async def measure_cells(setup: Setup, session: aiohttp.ClientSession) -> list[dict[str, Any]]:
    """Every (kind, concurrency, target) cell, ``--repeats`` rounds; targets interleaved per
    cell so machine noise hits them alike."""
    a = setup.args
    rows = []
    for rnd in range(a.repeats):
        rows += await measure_round(setup, session, rnd)
    return rows


async def measure_round(
    setup: Setup, session: aiohttp.ClientSession, rnd: int
) -> list[dict[str, Any]]:
    a = setup.args
    rows = []
    for kind in KINDS:
        stream = kind == "stream"
        body = chat_body(MODEL, stream)
        for target in setup.targets():  # warm-up: connections, caches, JIT-less but lazy imports
            req = aiohttp_request(session, setup.urls[target] + "/v1/chat/completions", body,
                                  stream, setup.headers(target))
            await closed_loop(req, 8, a.warmup)
        for conc in a.concurrency:
            for target in setup.targets():
                url = setup.urls[target]
                req = aiohttp_request(session, url + "/v1/chat/completions", body, stream,
                                      setup.headers(target))
                pid = setup.pids.get(target)
                gc0 = await gc_counters(session, url) if pid and target != "litellm" else None
                cpu0 = tree_cpu_s(pid) if pid else 0.0
                cell: Cell = await closed_loop(req, conc, a.duration)
                cpu = tree_cpu_s(pid) - cpu0 if pid else None
                gc1 = await gc_counters(session, url) if gc0 is not None else None
                row = {"kind": kind, "concurrency": conc, "target": target, "round": rnd,
                       **cell.summary(),
                       "cpu_s": None if cpu is None else round(cpu, 4),
                       "gc": gc_delta(gc0, gc1)}
                rows.append(row)
                progress(a, f"  {kind:10} c={conc:<3} {target:9} {row['rps']:8.0f} req/s  "
                            f"p50 {row['p50_ms']:.2f}  p99 {row['p99_ms']:.2f} ms")
    return rows


async def open_streams_rss(setup: Setup, target: str, n: int) -> dict[str, Any]:
    """RSS of ``target`` before and while ``n`` streams are open (the engine holds them)."""
    pid = setup.pids[target]
    body = orjson.dumps({**orjson.loads(chat_body(MODEL, True)), "user": "hold"})
    hdrs = {"Content-Type": "application/json", **(setup.headers(target) or {})}
    before = tree_rss_kib(pid)
    opened = asyncio.Event()
    release = asyncio.Event()
    count = 0
    errors: dict[str, int] = {}

    async def one(session: aiohttp.ClientSession) -> None:
        nonlocal count
        try:
            async with session.post(setup.urls[target] + "/v1/chat/completions", data=body,
                                    headers=hdrs) as r:
                if r.status != 200:
                    errors[f"http {r.status}"] = errors.get(f"http {r.status}", 0) + 1
                    return
                await r.content.readany()
                count += 1
                if count == n:
                    opened.set()
                await release.wait()
        except aiohttp.ClientError as e:
            errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1

    async with new_session() as session:
        tasks = [asyncio.create_task(one(session)) for _ in range(n)]
        try:
            await asyncio.wait_for(opened.wait(), 60)
            await asyncio.sleep(0.3)
            during = tree_rss_kib(pid)
        except TimeoutError:
            during = float("nan")
        release.set()  # closing each response closes its connection: the stream ends
        await asyncio.gather(*tasks, return_exceptions=True)
    return {"streams": count, "rss_before_kib": round(before), "rss_open_kib": round(during),
            "per_stream_kib": round((during - before) / max(count, 1), 1), "errors": errors}


async def run(setup: Setup) -> dict[str, Any]:
    a = setup.args
    async with new_session() as session:
        rows = await measure_cells(setup, session)
    rss = {}
    for target in setup.pids:
        rss[target] = {"start_kib": round(setup.rss_start[target]),
                       "processes": len(tree(setup.pids[target])),
                       **await open_streams_rss(setup, target, a.hold)}
    errors = {f"{r['kind']} c={r['concurrency']} {r['target']}": r["errors"]
              for r in rows if r["errors"]}
    errors.update({f"open streams {t}": v["errors"] for t, v in rss.items() if v["errors"]})
    return {
        "cells": rows, "summary": summarize(merge_rounds(rows), a.chunks), "rss": rss,
        "errors": errors,
        "settings": {
            "duration_s": a.duration, "repeats": a.repeats, "concurrency": a.concurrency,
            "chunks": a.chunks,
            "events_per_stream": a.chunks + 1, "workers": a.workers, "hold": a.hold,
            "server_cpus": sorted(setup.server_cpus or []),
            "loadgen_cpus": sorted(setup.loadgen_cpus or []),
            "python": platform.python_version(), "loadavg": os.getloadavg(),
            "targets": setup.targets(), "base": a.base,
        },
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=3.0, help="seconds per cell")
    p.add_argument("--warmup", type=float, default=0.5, help="seconds per target and kind")
    p.add_argument("--repeats", type=int, default=1,
                   help="rounds of every cell (medians of req/s and latencies, CPU summed)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    p.add_argument("--chunks", type=int, default=20, help="content chunks per stream")
    p.add_argument("--workers", type=int, default=1, help="gateway (and LiteLLM) workers")
    p.add_argument("--hold", type=int, default=500, help="streams held open for RSS")
    p.add_argument("--base", default="", help="also run the gateway of this checkout")
    p.add_argument("--two-workers", action="store_true",
                   help="also run this gateway with server.workers 2, not pinned")
    p.add_argument("--floor", action="store_true",
                   help="also run loadtests.floor_proxy: the HTTP stack alone, pinned likewise")
    p.add_argument("--litellm-venv", default=str(DEFAULT_VENV))
    p.add_argument("--no-litellm", dest="litellm", action="store_false")
    p.add_argument("--no-pin", dest="pin", action="store_false")
    p.add_argument("--quick", action="store_true", help="c=1 and 32, short cells (tests)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quiet", action="store_true", help="no per-cell progress on stderr")
    args = p.parse_args(argv)
    if args.quick:
        args.duration, args.warmup, args.hold = 0.4, 0.2, 20
        if "--concurrency" not in (argv if argv is not None else sys.argv):
            args.concurrency = [1, 32]
    install_loop()
    raise_on_sigterm()
    setup = Setup(args)
    try:
        setup.start()
        result = asyncio.run(run(setup))
    except LiteLLMError as e:
        print(f"bench_capacity_core: LiteLLM did not start: {e}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        setup.stop()
    if args.json:
        print(json.dumps(result))
    else:
        print_report(result)
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
