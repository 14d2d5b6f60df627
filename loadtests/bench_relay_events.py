"""Gateway CPU per relayed event when tokens arrive one by one, as a decoding engine writes them.

``bench_capacity_core`` sends each stream's 21 events in one write (a burst), so its CPU per
event is mostly the request's own cost divided by 21. A production stream is the other way
round: hundreds of events, each in a read of its own, each relayed in a write of its own, a
few milliseconds apart. This benchmark measures that shape: the raw engine
(``loadtests.raw_engine --pace-s``) writes ``--chunks`` events ``--pace-s`` apart; closed loops
of ``--concurrency`` streams run for ``--duration`` seconds through each target, pinned alone
on one core (the engine and this load generator on the other, as ``bench_capacity_core``):

- ``floor``: ``loadtests.floor_proxy``, the gateway's HTTP stack passing bytes through;
- ``speedgate``: the gateway of this checkout; ``base``: another checkout's (``--base DIR``).

For streams and for non-stream requests (which the gateway assembles from the engine's
stream): the target's CPU (user + system) per relayed event, i.e. per engine event (chunks,
the usage chunk the gateway asks for, ``[DONE]``), and per request; medians over
``--repeats`` interleaved rounds. The floor's non-stream row is absent: it asks the engine for
JSON (no events).

Run::

    .venv/bin/python -m loadtests.bench_relay_events                 # ~1 minute
    .venv/bin/python -m loadtests.bench_relay_events --base /tmp/sg-base --repeats 5 --json

Exit status 1 when any request failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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

KINDS = ("stream", "non-stream")


def start(args: argparse.Namespace, tmp: Path, procs: list[Any]) -> tuple[dict[str, str], dict]:
    """The paced engine, the floor proxy and the gateways; their URLs and pids."""
    cpus = sorted(os.sched_getaffinity(0))
    server = loadgen = None
    if args.pin and len(cpus) >= 2:
        server, loadgen = {cpus[0]}, set(cpus[1:])
        os.sched_setaffinity(0, loadgen)
    engine = start_raw_engine(SERVED, args.chunks, loadgen, args.pace_s)
    procs.append(engine.proc)
    direct = engine.wait_ready("/health")
    cfg = tmp / "gateway.yaml"
    cfg.write_text(yaml.safe_dump(gateway_config(direct)))
    servers = {"floor": start_floor_proxy(direct, server)}
    servers["speedgate"] = start_gateway(str(cfg), str(tmp / "speedgate.log"), cpus=server)
    if args.base:
        servers["base"] = start_gateway(str(cfg), str(tmp / "base.log"), cpus=server,
                                        source=str(Path(args.base).resolve()))
    procs += [s.proc for s in servers.values()]
    urls = {name: s.wait_ready("/readyz", timeout_s=60) for name, s in servers.items()}
    return urls, {name: s.pid for name, s in servers.items()}


async def measure(args: argparse.Namespace, urls: dict[str, str], pids: dict) -> list[dict]:
    """Every (round, kind, target) cell, targets interleaved per round (``bench_stack``'s
    too): per cell the target's CPU per request and per engine event, p50 and p99."""
    rows = []
    # engine events per request: the chunks, the usage chunk (the gateway asks for usage the
    # client did not; the floor passes the client's body as is) and [DONE]
    async with new_session() as session:
        for rnd in range(args.repeats):
            for kind in KINDS:
                stream = kind == "stream"
                for target, url in urls.items():
                    if target == "floor" and not stream:
                        continue
                    req = aiohttp_request(session, url + "/v1/chat/completions",
                                          chat_body(MODEL, stream), stream, None)
                    await closed_loop(req, min(4, args.concurrency), args.warmup)
                    cpu0 = tree_cpu_s(pids[target])
                    cell = await closed_loop(req, args.concurrency, args.duration)
                    cpu = tree_cpu_s(pids[target]) - cpu0
                    s = cell.summary()
                    events = s["ok"] * (args.chunks + (1 if target == "floor" else 2))
                    rows.append({"round": rnd, "kind": kind, "target": target, "ok": s["ok"],
                                 "errors": s["errors"], "cpu_s": round(cpu, 4),
                                 "us_per_event": round(cpu * 1e6 / max(events, 1), 2),
                                 "us_per_request": round(cpu * 1e6 / max(s["ok"], 1), 1),
                                 "p50_ms": s["p50_ms"], "p99_ms": s["p99_ms"]})  # fmt: skip
                    if not args.quiet:
                        print(f"  r{rnd} {kind:10} {target:9} {s['ok']:5} requests  "
                              f"{rows[-1]['us_per_event']:6.2f} µs/event", file=sys.stderr)
    return rows


def summarize(rows: list[dict]) -> dict[str, dict[str, dict[str, float]]]:
    """Per kind and target: medians of µs per event and per request over the rounds."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for kind in KINDS:
        for target in dict.fromkeys(r["target"] for r in rows if r["kind"] == kind):
            rs = [r for r in rows if r["kind"] == kind and r["target"] == target]
            out.setdefault(kind, {})[target] = {
                "us_per_event": round(statistics.median(r["us_per_event"] for r in rs), 2),
                "us_per_request": round(statistics.median(r["us_per_request"] for r in rs), 1),
                "requests": sum(r["ok"] for r in rs),
            }
    return out


def add_run_args(p: argparse.ArgumentParser, duration_s: float) -> None:
    """The options of a paced-engine run shared with ``bench_step_budget``: ``--chunks``,
    ``--pace-s`` (seconds), ``--duration`` (seconds per cell, default ``duration_s``),
    ``--warmup``, ``--repeats``, ``--base``, ``--no-pin``, ``--json``, ``--quiet``."""
    p.add_argument("--chunks", type=int, default=100, help="content chunks per stream")
    p.add_argument("--pace-s", type=float, default=0.001, help="seconds between events")
    p.add_argument("--duration", type=float, default=duration_s, help="seconds per cell")
    p.add_argument("--warmup", type=float, default=0.3, help="seconds before each cell")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds (medians)")
    p.add_argument("--base", default="", help="also run the gateway of this checkout")
    p.add_argument("--no-pin", dest="pin", action="store_false")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quiet", action="store_true", help="no per-cell progress on stderr")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_args(p, 4.0)
    p.add_argument("--concurrency", type=int, default=16, help="streams at once")
    args = p.parse_args(argv)
    install_loop()
    raise_on_sigterm()
    procs: list[Any] = []
    with tempfile.TemporaryDirectory(prefix="speedgate-events-") as tmp:
        try:
            urls, pids = start(args, Path(tmp), procs)
            rows = asyncio.run(measure(args, urls, pids))
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
        finally:
            stop_processes(procs)
    summary = summarize(rows)
    errors = {f"{r['kind']} {r['target']} r{r['round']}": r["errors"] for r in rows if r["errors"]}
    settings = {"chunks": args.chunks, "pace_s": args.pace_s, "concurrency": args.concurrency,
                "duration_s": args.duration, "repeats": args.repeats, "base": args.base,
                "loadavg": os.getloadavg()}  # fmt: skip
    if args.json:
        print(json.dumps({"summary": summary, "rows": rows, "errors": errors,
                          "settings": settings}))
    else:
        print(f"{args.chunks} events per stream, {args.pace_s * 1e3:g} ms apart, "
              f"{args.concurrency} streams at once; load average {settings['loadavg'][0]:.2f}")
        print("| kind | target | µs per relayed event | µs per request | requests |")
        print("|---|---|---|---|---|")
        for kind, targets in summary.items():
            for target, s in targets.items():
                print(f"| {kind} | {target} | {s['us_per_event']:.2f} | "
                      f"{s['us_per_request']:,.0f} | {s['requests']:,} |")
        for name, err in errors.items():
            print(f"errors {name}: {err}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
