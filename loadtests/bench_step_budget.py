"""The step budget: where the gateway's CPU per request and per event goes, step by
step, against the floor of its HTTP stack, measured in one run.

Setup: two raw zero-delay engines (``loadtests.raw_engine``), *burst* (each stream's events in
one write) and *paced* (one write per event, ``--pace-s`` apart), ``--chunks`` content chunks
each (100: a stream relays ``chunks + 1`` events to the client, the gateway reads one more, the
usage chunk it asks for); the engines and this closed-loop load generator on one core, and on
the other core alone (``os.sched_setaffinity``, as ``taskset`` does; ``--no-pin`` turns it
off), one at a time:

- ``floor``: ``loadtests.floor_proxy`` in front of each engine, the gateway's HTTP stack
  passing bytes through (a non-stream request gets the engine's JSON answer);
- ``speedgate``: the gateway of this checkout, one worker, both engines as two models;
- ``base``: another checkout's gateway (``--base DIR``), the same config.

Cells: workload (burst at ``--concurrency``, default 32; paced at ``--paced-concurrency``) ×
kind (stream, non-stream) × target, ``--repeats`` interleaved rounds. Per cell: the target's
CPU (user + system, kernel counters) per request and per engine event, latency p50/p99, and
``py-spy record`` samples of the target (``--rate`` Hz, non-blocking, py-spy on the load
generator's core), attributed to the request path's steps by module
(``loadtests.profile_steps``: admit, plan, route, attempt, relay, account, telemetry, http
stack, other). A step's µs are the cell's measured CPU times its share of the samples, so the
steps sum to the total. The report: per step µs per request and per event, gateway vs floor
ratios against the step budget's targets (non-stream ≤ 2.0× floor, per event ≤ 1.3× floor,
non-stream ≤ 1.1× stream, p99 at c=32 ≤ 1.5× floor p99) and the top ``--top`` functions (self
and cumulative % of the samples) of each gateway cell.

Run::

    .venv/bin/python -m loadtests.bench_step_budget               # ~2 minutes
    .venv/bin/python -m loadtests.bench_step_budget --base /tmp/sg-base --repeats 5 --json

Needs py-spy (the dev extras) allowed to read the target's memory (root, or ptrace allowed).
Exit status 1 when any request failed, 2 when py-spy is missing or cannot attach.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from loadtests._common import (
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
from loadtests.bench_capacity_core import MODEL, SERVED, gateway_config, tree_cpu_s
from loadtests.bench_relay_events import add_run_args
from loadtests.profile_steps import STEPS, Profile, Sampler, split_us

KINDS = ("stream", "non-stream")
WORKLOADS = ("burst", "paced")
PACED_MODEL = MODEL + "-paced"
# the step budget's targets: ratio → its limit (the non-stream and p99 ones checked for both shapes)
TARGETS = {"non_stream_vs_floor": 2.0, "per_event_vs_floor": 1.3,
           "non_stream_vs_stream": 1.1, "non_stream_vs_stream_burst": 1.1,
           "p99_c32_vs_floor": 1.5, "p99_c32_vs_floor_stream": 1.5}  # fmt: skip


def find_py_spy() -> str | None:
    """py-spy beside this interpreter (the venv's), else on PATH; None when absent."""
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


class Bench:
    """The engines, floors and gateways of one run, and its cells."""

    def __init__(self, args: argparse.Namespace, tmp: Path, py_spy: str) -> None:
        self.args, self.tmp, self.py_spy = args, tmp, py_spy
        self.procs: list[Any] = []
        self.server: set[int] | None = None
        self.loadgen: set[int] | None = None
        self.urls: dict[tuple[str, str], str] = {}  # (workload, target) → URL
        self.pids: dict[tuple[str, str], int] = {}

    def start(self) -> None:
        a = self.args
        cpus = sorted(os.sched_getaffinity(0))
        if a.pin and len(cpus) >= 2:
            self.server, self.loadgen = {cpus[0]}, set(cpus[1:])
            os.sched_setaffinity(0, self.loadgen)
        engines = {"burst": start_raw_engine(SERVED, a.chunks, self.loadgen),
                   "paced": start_raw_engine(SERVED, a.chunks, self.loadgen, a.pace_s)}
        self.procs += [e.proc for e in engines.values()]
        direct = {w: e.wait_ready("/health") for w, e in engines.items()}
        cfg = gateway_config(direct["burst"])
        paced = dict(cfg["models"][MODEL])
        paced["tiers"] = {"standard": {**paced["tiers"]["standard"],
                                       "endpoints": [direct["paced"]]}}
        cfg["models"][PACED_MODEL] = paced
        path = self.tmp / "gateway.yaml"
        path.write_text(yaml.safe_dump(cfg))
        servers = {(w, "floor"): start_floor_proxy(direct[w], self.server) for w in WORKLOADS}
        gateways = {"speedgate": start_gateway(str(path), str(self.tmp / "speedgate.log"),
                                               cpus=self.server)}
        if a.base:
            gateways["base"] = start_gateway(str(path), str(self.tmp / "base.log"),
                                             cpus=self.server,
                                             source=str(Path(a.base).resolve()))
        self.procs += [s.proc for s in (*servers.values(), *gateways.values())]
        for key, srv in servers.items():
            self.urls[key], self.pids[key] = srv.wait_ready("/readyz"), srv.pid
        for name, srv in gateways.items():
            url = srv.wait_ready("/readyz", timeout_s=60)
            for w in WORKLOADS:
                self.urls[(w, name)], self.pids[(w, name)] = url, srv.pid

    def targets(self) -> list[str]:
        return [t for t in ("floor", "speedgate", "base") if ("burst", t) in self.urls]

    async def cell(self, session: Any, rnd: int, workload: str, kind: str,
                   target: str) -> tuple[dict[str, Any], Profile]:  # fmt: skip
        a = self.args
        stream = kind == "stream"
        model = MODEL if workload == "burst" else PACED_MODEL
        conc = a.concurrency if workload == "burst" else a.paced_concurrency
        req = aiohttp_request(session, self.urls[(workload, target)] + "/v1/chat/completions",
                              chat_body(model, stream), stream)
        await closed_loop(req, min(4, conc), a.warmup)
        pid = self.pids[(workload, target)]
        sampler = Sampler(self.py_spy, pid, self.tmp / f"spy-{rnd}-{workload}-{kind}-{target}",
                          a.rate, self.loadgen)
        cpu0 = tree_cpu_s(pid)
        cell = await closed_loop(req, conc, a.duration)
        cpu = tree_cpu_s(pid) - cpu0
        prof = sampler.stop()
        s = cell.summary()
        # engine events per request: the chunks, [DONE], and the usage chunk the gateway asks
        # for (the floor passes the client's body: no usage chunk); a JSON answer: none
        events = 0 if target == "floor" and not stream else a.chunks + (1 if target == "floor"
                                                                        else 2)
        row = {"round": rnd, "workload": workload, "kind": kind, "target": target,
               "concurrency": conc, "ok": s["ok"], "errors": s["errors"], "rps": s["rps"],
               "p50_ms": s["p50_ms"], "p99_ms": s["p99_ms"], "cpu_s": round(cpu, 4),
               "us_per_request": round(cpu * 1e6 / max(s["ok"], 1), 1),
               "events_per_request": events, "samples": prof.total}  # fmt: skip
        if not a.quiet:
            print(f"  r{rnd} {workload:5} {kind:10} {target:9} {s['ok']:6} req "
                  f"{row['us_per_request']:8.1f} µs/req  p99 {s['p99_ms']:.2f} ms  "
                  f"{prof.total} samples", file=sys.stderr)
        return row, prof

    async def measure(self) -> tuple[list[dict[str, Any]], dict[tuple[str, str, str], Profile]]:
        rows: list[dict[str, Any]] = []
        profiles: dict[tuple[str, str, str], Profile] = {}
        async with new_session() as session:
            for rnd in range(self.args.repeats):
                for workload in WORKLOADS:
                    for kind in KINDS:
                        for target in self.targets():
                            row, prof = await self.cell(session, rnd, workload, kind, target)
                            rows.append(row)
                            profiles.setdefault((workload, kind, target), Profile()).merge(prof)
        return rows, profiles


def summarize(rows: list[dict[str, Any]], profiles: dict[tuple[str, str, str], Profile],
              top: int) -> dict[str, Any]:  # fmt: skip
    """Per (workload, kind, target): medians over the rounds of µs per request, p50, p99;
    µs per event; the steps' µs per request and per event (their sum is the total); the top
    functions. Then the ratios against the step budget's targets."""
    cells: dict[str, dict[str, dict[str, Any]]] = {}
    for (workload, kind, target), prof in profiles.items():
        rs = [r for r in rows if (r["workload"], r["kind"], r["target"]) == (workload, kind,
                                                                          target)]
        per_req = statistics.median(r["us_per_request"] for r in rs)
        events = rs[0]["events_per_request"]
        steps = split_us(per_req, prof)
        cells.setdefault(f"{workload} {kind}", {})[target] = {
            "us_per_request": round(per_req, 1),
            "us_per_event": round(per_req / events, 2) if events else None,
            "events_per_request": events,
            "p50_ms": statistics.median(r["p50_ms"] for r in rs),
            "p99_ms": statistics.median(r["p99_ms"] for r in rs),
            "concurrency": rs[0]["concurrency"],
            "requests": sum(r["ok"] for r in rs), "samples": prof.total,
            "steps_us_per_request": steps,
            "steps_us_per_event": {s: round(v / events, 2) for s, v in steps.items()}
            if events else None,
            "top_cumulative": prof.top(top), "top_self": prof.top_self(top),
            "other_files": prof.other_top(top),
        }  # fmt: skip
    return {"cells": cells, "ratios": ratios(cells)}


def ratios(cells: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Each gateway's ratio against the step budget's targets (name → value, limit, met)."""
    out: dict[str, dict[str, Any]] = {}
    for gw in ("speedgate", "base"):
        if gw not in cells.get("burst stream", {}):
            continue
        c = {k: v[gw] for k, v in cells.items()}
        f = {k: v["floor"] for k, v in cells.items()}
        vals = {
            "non_stream_vs_floor": c["burst non-stream"]["us_per_request"]
            / f["burst non-stream"]["us_per_request"],
            "per_event_vs_floor": c["paced stream"]["us_per_event"]
            / f["paced stream"]["us_per_event"],
            "non_stream_vs_stream": c["paced non-stream"]["us_per_request"]
            / c["paced stream"]["us_per_request"],
            "non_stream_vs_stream_burst": c["burst non-stream"]["us_per_request"]
            / c["burst stream"]["us_per_request"],
            "p99_c32_vs_floor": c["burst non-stream"]["p99_ms"] / f["burst non-stream"]["p99_ms"],
            "p99_c32_vs_floor_stream": c["burst stream"]["p99_ms"] / f["burst stream"]["p99_ms"],
        }  # fmt: skip
        # judged on the ratio as printed (two decimals), so a reader's check agrees with it
        out[gw] = {k: {"ratio": round(v, 2), "limit": TARGETS[k],
                       "met": round(v, 2) <= TARGETS[k]} for k, v in vals.items()}
    return out


def print_report(res: dict[str, Any], top: int) -> None:
    s = res["settings"]
    print(f"step budget: {s['chunks']} chunks per stream; burst c={s['concurrency']}, paced "
          f"c={s['paced_concurrency']} {s['pace_s'] * 1e3:g} ms apart; {s['repeats']} rounds x "
          f"{s['duration_s']} s; py-spy {s['rate']} Hz; load average {s['loadavg'][0]:.2f}")
    print("\nCPU µs per request by step (per engine event in brackets)\n")
    print("| cell | target | " + " | ".join(STEPS) + " | total | p50 ms | p99 ms |")
    print("|---|---|" + "---|" * (len(STEPS) + 3))
    for name, targets in res["summary"]["cells"].items():
        for target, c in targets.items():
            ev = c["steps_us_per_event"]
            parts = [f"{v:,.0f}" + (f" [{ev[st]:.1f}]" if ev else "")
                     for st, v in c["steps_us_per_request"].items()]
            tot = f"**{c['us_per_request']:,.0f}**" + (f" [{c['us_per_event']:.1f}]" if ev
                                                       else "")
            print(f"| {name} | {target} | " + " | ".join(parts)
                  + f" | {tot} | {c['p50_ms']:.2f} | {c['p99_ms']:.2f} |")
    print("\nthe step budget's targets\n")
    print("| gateway | ratio | value | limit | met |\n|---|---|---|---|---|")
    for gw, rs in res["summary"]["ratios"].items():
        for k, v in rs.items():
            print(f"| {gw} | {k} | {v['ratio']:.2f} | {v['limit']} | "
                  f"{'yes' if v['met'] else 'no'} |")
    for name, targets in res["summary"]["cells"].items():
        c = targets.get("speedgate")
        if c is None:
            continue
        print(f"\ntop {top} functions, speedgate, {name} ({c['samples']} samples): "
              "cumulative % | self % | step")
        for row in c["top_cumulative"]:
            print(f"  {row['cum_pct']:6.2f} {row['self_pct']:6.2f}  {row['step']:10} "
                  f"{row['function']}")
        print("  other, by module: " + ", ".join(f"{r['file']} {r['pct']:.1f}%"
                                                 for r in c["other_files"]))
        print("  by self:")
        for row in c["top_self"]:
            print(f"  {row['cum_pct']:6.2f} {row['self_pct']:6.2f}  {row['step']:10} "
                  f"{row['function']}")
    for name, err in res["errors"].items():
        print(f"errors {name}: {err}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_args(p, 3.0)
    p.add_argument("--concurrency", type=int, default=32, help="burst: requests at once")
    p.add_argument("--paced-concurrency", type=int, default=16, help="paced: streams at once")
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    p.add_argument("--top", type=int, default=15, help="functions listed per cell")
    args = p.parse_args(argv)
    py_spy = find_py_spy()
    if py_spy is None:
        print("bench_step_budget: py-spy is not installed (pip install py-spy)", file=sys.stderr)
        return 2
    install_loop()
    raise_on_sigterm()
    with tempfile.TemporaryDirectory(prefix="speedgate-steps-") as tmp:
        bench = Bench(args, Path(tmp), py_spy)
        try:
            bench.start()
            rows, profiles = asyncio.run(bench.measure())
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
        except RuntimeError as e:
            print(f"bench_step_budget: {e}", file=sys.stderr)
            return 2
        finally:
            stop_processes(bench.procs)
    errors = {f"{r['workload']} {r['kind']} {r['target']} r{r['round']}": r["errors"]
              for r in rows if r["errors"]}  # fmt: skip
    settings = {k: getattr(args, k) for k in ("chunks", "pace_s", "concurrency",
                                              "paced_concurrency", "repeats", "rate", "base")}
    settings.update(duration_s=args.duration, loadavg=os.getloadavg(),
                    server_cpus=sorted(bench.server or []),
                    loadgen_cpus=sorted(bench.loadgen or []))
    res = {"summary": summarize(rows, profiles, args.top), "rows": rows, "errors": errors,
           "settings": settings}  # fmt: skip
    if args.json:
        print(json.dumps(res))
    else:
        print_report(res, args.top)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
