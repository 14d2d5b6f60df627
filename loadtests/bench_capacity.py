"""Capacity: how many slow open streams one gateway process holds, and the memory per stream.

Method: starts ``--sims`` engine simulators and one gateway process (one worker, log level
warning, no access log, health probes on, no in-flight cap) with them as one pool. This process
(uvloop, one aiohttp session without a connection limit) opens ``--streams`` streaming chat
requests at ``--ramp`` per second; each asks the simulator, through the per-request fault
field, for ``--tokens`` content chunks ``--interval`` s apart (``sim_faults.chunk_interval_s``),
so every stream stays open ``tokens x interval`` seconds while sending a chunk now and then:
the shape of many slow generations, or clients reading slowly.

Measured: the gateway's resident memory (``VmRSS`` from ``/proc``) before the ramp (after a
warm-up) and when every stream is open (peak over the plateau); memory per stream = the
difference / streams open; the most streams open at once (response headers received, ``[DONE]``
not yet); streams that completed with ``[DONE]`` and every failure by kind; the gateway's CPU use
during the plateau; ``/healthz`` latency through the gateway during the plateau (is the event
loop still responsive?); and the gap between chunks seen by the client (p50/p99, against the
scripted interval). The exit status is 1 when any stream failed or fewer than ``--streams``
were open at once.

Run (defaults take about two minutes; the process needs ~2 file descriptors per stream)::

    .venv/bin/python -m loadtests.bench_capacity
    .venv/bin/python -m loadtests.bench_capacity --streams 10000 --sims 4 --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

from loadtests._common import (
    chat_body,
    cpu_seconds,
    install_loop,
    pct,
    raise_on_sigterm,
    start_gateway,
    start_sim,
    stop_processes,
)

MODEL = "cap"


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class State:
    def __init__(self) -> None:
        self.open = 0
        self.max_open = 0
        self.done = 0
        self.errors: Counter = Counter()
        self.gaps: list[float] = []


async def one_stream(session: aiohttp.ClientSession, url: str, body: bytes, st: State,
                     record_gaps: bool) -> None:
    opened = False
    try:
        async with session.post(url, data=body,
                                headers={"Content-Type": "application/json"}) as r:
            if r.status != 200:
                await r.read()
                st.errors[f"http {r.status}"] += 1
                return
            opened = True  # headers received: the gateway holds this stream open
            st.open += 1
            st.max_open = max(st.max_open, st.open)
            last = None
            done = False
            async for line in r.content:
                if line.startswith(b"data: [DONE]"):
                    done = True
                    break
                if not line.startswith(b"data: ") or b'"content":"' not in line:
                    continue
                now = time.perf_counter()
                if record_gaps and last is not None:
                    st.gaps.append(now - last)
                last = now
            if done:
                st.done += 1
            else:
                st.errors["no [DONE]"] += 1
    except Exception as e:  # counted, never hidden
        st.errors[type(e).__name__] += 1
    finally:
        if opened:
            st.open -= 1


async def probe_health(url: str, until: float, lat: list[float]) -> None:
    async with aiohttp.ClientSession() as s:
        while time.perf_counter() < until:
            t0 = time.perf_counter()
            try:
                async with s.get(url + "/healthz") as r:
                    await r.read()
                lat.append(time.perf_counter() - t0)
            except Exception:
                lat.append(float("inf"))
            await asyncio.sleep(0.2)


async def run(args: argparse.Namespace, gw_url: str, gw_pid: int) -> dict[str, Any]:
    doc = orjson.loads(chat_body(MODEL, True, max_tokens=args.tokens))
    doc["sim_faults"] = {"chunk_interval_s": args.interval, "output_tokens": args.tokens}
    body = orjson.dumps(doc)
    url = gw_url + "/v1/chat/completions"
    st = State()
    conn = aiohttp.TCPConnector(limit=0, limit_per_host=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=args.tokens * args.interval + 120)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        # warm-up: a few quick streams so that lazy state exists before the baseline
        warm = State()
        quick = orjson.loads(chat_body(MODEL, True, max_tokens=4))
        await asyncio.gather(*(one_stream(session, url, orjson.dumps(quick), warm, False)
                               for _ in range(20)))
        await asyncio.sleep(1.0)
        rss0 = rss_kib(gw_pid)
        tasks = []
        t0 = time.perf_counter()
        for i in range(args.streams):
            delay = t0 + i / args.ramp - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(
                one_stream(session, url, body, st, record_gaps=i % 10 == 0)))
        ramp_s = time.perf_counter() - t0
        # plateau: wait until all are open (or the first streams start to finish)
        hold = args.tokens * args.interval
        deadline = t0 + hold * 0.9
        while time.perf_counter() < deadline:  # polled: a counter, not an event
            if st.max_open >= args.streams:
                break
            await asyncio.sleep(0.1)
        plateau_open = st.open
        lat: list[float] = []
        cpu0, w0 = cpu_seconds(gw_pid), time.perf_counter()
        rss_peak = rss_kib(gw_pid)
        probe_until = min(deadline, time.perf_counter() + args.probe_s)
        probe = asyncio.create_task(probe_health(gw_url, probe_until, lat))
        while time.perf_counter() < probe_until:
            rss_peak = max(rss_peak, rss_kib(gw_pid))
            await asyncio.sleep(0.25)
        await probe
        cpu1, w1 = cpu_seconds(gw_pid), time.perf_counter()
        await asyncio.gather(*tasks)
        rss_end = rss_kib(gw_pid)
    held = max(1, plateau_open)
    return {
        "streams": args.streams,
        "interval_s": args.interval,
        "tokens": args.tokens,
        "ramp_per_s": args.ramp,
        "ramp_s": round(ramp_s, 1),
        "max_open_at_once": st.max_open,
        "open_at_plateau": plateau_open,
        "completed": st.done,
        "errors": dict(st.errors),
        "rss_baseline_mib": round(rss0 / 1024, 1),
        "rss_plateau_peak_mib": round(rss_peak / 1024, 1),
        "rss_after_mib": round(rss_end / 1024, 1),
        "kib_per_stream": round((rss_peak - rss0) / held, 1),
        "gateway_cpu_pct_plateau": (
            round((cpu1 - cpu0) / (w1 - w0) * 100, 1) if cpu0 is not None and cpu1 else None
        ),
        "healthz_p50_ms": round(pct(lat, 0.5) * 1e3, 2) if lat else None,
        "healthz_p99_ms": round(pct(lat, 0.99) * 1e3, 2) if lat else None,
        "chunk_gap_p50_ms": round(pct(st.gaps, 0.5) * 1e3, 1) if st.gaps else None,
        "chunk_gap_p99_ms": round(pct(st.gaps, 0.99) * 1e3, 1) if st.gaps else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=5000)
    p.add_argument("--interval", type=float, default=2.0, help="seconds between chunks")
    p.add_argument("--tokens", type=int, default=45, help="chunks per stream")
    p.add_argument("--ramp", type=float, default=250, help="new streams per second")
    p.add_argument("--sims", type=int, default=2, help="simulator processes behind the gateway")
    p.add_argument("--probe-s", type=float, default=8.0, help="plateau measurement seconds")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    need = 2 * args.streams + 200
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(need, soft), hard), hard))
    install_loop()
    raise_on_sigterm()
    procs: list[Any] = []
    tmp = tempfile.TemporaryDirectory(prefix="speedgate-capacity-")
    try:
        sims = []
        for _ in range(args.sims):
            sim = start_sim(MODEL, args.tokens)
            procs.append(sim.proc)
            sims.append(sim)
        sim_urls = [sim.wait_ready() for sim in sims]  # they boot in parallel
        timeouts = {"connect_s": 5, "ttft_s": 60, "stall_s": 60, "total_s": 3600}
        cfg = {
            "server": {"host": "127.0.0.1", "port": 0, "log_level": "warning",
                       "access_log": False, "workers": 1},
            "health": {"enabled": True, "interval_s": 2, "timeout_s": 2},
            "models": {MODEL: {"tiers": {"standard": {
                "served_model_name": MODEL, "endpoints": sim_urls,
                "timeouts": timeouts}}}},
        }  # fmt: skip
        cfg_path = Path(tmp.name) / "gateway.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg))
        log_path = Path(tmp.name) / "gateway.log"
        gw = start_gateway(str(cfg_path), str(log_path))
        procs.append(gw.proc)
        gw_url = gw.wait_ready("/readyz")
        res = asyncio.run(run(args, gw_url, gw.pid))
        log = log_path.read_text(errors="replace")
        res["gateway_log_problem_lines"] = sum(
            1 for ln in log.splitlines() if "ERROR" in ln or "Traceback" in ln
        )
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        stop_processes(procs)
        tmp.cleanup()
    if args.json:
        print(json.dumps(res))
    else:
        print(f"\nCapacity: one gateway process, {res['streams']} streams opened at "
              f"{res['ramp_per_s']:.0f}/s, each {res['tokens']} chunks {res['interval_s']} s "
              f"apart ({args.sims} simulators behind)")
        print(f"  streams open at once (max): {res['max_open_at_once']}  "
              f"(at plateau: {res['open_at_plateau']}, ramp {res['ramp_s']} s); "
              f"completed with [DONE]: {res['completed']}; errors: {res['errors'] or 'none'}")
        print(f"  gateway RSS: {res['rss_baseline_mib']} MiB before -> "
              f"{res['rss_plateau_peak_mib']} MiB with all streams open -> "
              f"{res['rss_after_mib']} MiB after; {res['kib_per_stream']} KiB per stream")
        print(f"  gateway CPU during plateau: {res['gateway_cpu_pct_plateau']} %; /healthz p50 "
              f"{res['healthz_p50_ms']} ms p99 {res['healthz_p99_ms']} ms; chunk gap seen by "
              f"clients p50 {res['chunk_gap_p50_ms']} ms p99 {res['chunk_gap_p99_ms']} ms")
    ok = not res["errors"] and res["max_open_at_once"] >= args.streams
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
