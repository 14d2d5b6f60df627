"""The gateway and its floor on candidate stacks (the stack check): uvicorn + aiohttp
against granian and against the pyreqwest client, CPU per request, side by side in one run.

A raw zero-delay burst engine (``loadtests.raw_engine``, ``--chunks`` chunks per stream) and
this load generator on one core; on the other, one at a time: the floor proxy
(``loadtests.floor_proxy``) and the gateway, each on uvicorn (as shipped: uvloop, httptools)
and on granian (``--interface asgi --loop uvloop``, one worker, the app's factory:
``floor_proxy:app_from_env``, ``gateway.app:create_app_from_env``). Granian binds the port it
is given: this script binds port 0 itself, reads the port and closes the socket just before
granian starts (a window another process could take; this is a measuring script, not a
test). Cells: stream and non-stream at ``--concurrency``, ``--repeats`` interleaved rounds;
the target's CPU (its process tree, user + system) per request, medians, and p99
(``bench_relay_events.measure``'s cells).

The pyreqwest candidate (``--stacks pyreqwest``): the floor and the gateway with pyreqwest as
their upstream client (``loadtests.pyreqwest_stack``, on uvicorn, ports reported through a
port file). ``--pace-s`` spaces the engine's chunks (one read per event) for the cost per
relayed event.

Run: ``.venv/bin/python -m loadtests.bench_stack [--stacks granian pyreqwest]`` (default:
every candidate installed; ``pip install granian pyreqwest``; exit status 2 when one asked
for, or all, are missing, 1 when a request failed).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from engines.procs import die_with_parent, wait_healthy
from loadtests._common import (
    Server,
    _spawn_server,
    install_loop,
    start_floor_proxy,
    start_gateway,
    start_raw_engine,
    stop_processes,
)
from loadtests.bench_capacity_core import SERVED, gateway_config
from loadtests.bench_relay_events import measure

KINDS = ("stream", "non-stream")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_granian(target: str, env: dict[str, str], cpus: set[int] | None,
                  log: Path) -> tuple[subprocess.Popen, str]:  # fmt: skip
    """``granian`` serving the factory ``target`` (``module:function``) with ``env`` added,
    pinned to ``cpus``; its process and URL once it answers ``/readyz``."""
    port = _free_port()
    granian = str(Path(sys.executable).parent / "granian")

    def setup() -> None:
        die_with_parent()
        if cpus:
            os.sched_setaffinity(0, cpus)

    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [granian, "--interface", "asgi", "--factory", "--loop", "uvloop", "--workers", "1",
             "--host", "127.0.0.1", "--port", str(port), "--no-access-log",
             "--log-level", "warning", target],
            env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=setup)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc, 60, "/readyz")
    return proc, url


def _has_pyreqwest() -> bool:
    return importlib.util.find_spec("pyreqwest") is not None


def _has_granian() -> bool:
    return (Path(sys.executable).parent / "granian").exists() or bool(shutil.which("granian"))


def available_stacks() -> list[str]:
    """The candidate stacks installed here (``granian``, ``pyreqwest``); uvicorn + aiohttp, as
    shipped, is always measured beside them."""
    return [n for n, ok in (("granian", _has_granian()), ("pyreqwest", _has_pyreqwest())) if ok]


def start_pyreqwest(kind: str, arg: str, cpus: set[int] | None, log: Path) -> Server:
    """``loadtests.pyreqwest_stack``'s ``floor`` (upstream URL ``arg``) or ``gateway`` (config
    path ``arg``) on uvicorn, port 0 reported through a port file, pinned to ``cpus``."""
    base = [sys.executable, "-m", "loadtests.pyreqwest_stack"]
    cmd = ([*base, "floor", "--upstream", arg, "--port", "0"] if kind == "floor"
           else [*base, "gateway", "serve", "-c", arg, "--port", "0"])  # fmt: skip
    with open(log, "wb") as out:
        return _spawn_server(cmd, cpus, stdout=out, stderr=subprocess.STDOUT,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--chunks", type=int, default=20, help="content chunks per stream")
    p.add_argument("--pace-s", type=float, default=0.0,
                   help="engine's gap between chunks (0: one burst); > 0: one read per event")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--duration", type=float, default=3.0, help="seconds per cell")
    p.add_argument("--warmup", type=float, default=0.3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--stacks", nargs="*", choices=("granian", "pyreqwest"), default=None,
                   help="candidates beside uvicorn + aiohttp (default: every one installed)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    have = available_stacks()
    stacks = have if args.stacks is None else args.stacks
    missing = sorted(set(stacks) - set(have))
    if missing or not stacks:
        print(f"bench_stack: not installed: {', '.join(missing) or 'granian, pyreqwest'} "
              "(pip install granian pyreqwest)", file=sys.stderr)
        return 2
    install_loop()
    cpus = sorted(os.sched_getaffinity(0))
    server = loadgen = None
    if len(cpus) >= 2:
        server, loadgen = {cpus[0]}, set(cpus[1:])
        os.sched_setaffinity(0, loadgen)
    procs: list[Any] = []
    with tempfile.TemporaryDirectory(prefix="speedgate-stack-") as tmp:
        try:
            engine = start_raw_engine(SERVED, args.chunks, loadgen, args.pace_s)
            procs.append(engine.proc)
            direct = engine.wait_ready("/health")
            cfg = Path(tmp) / "gateway.yaml"
            cfg.write_text(yaml.safe_dump(gateway_config(direct)))
            urls, pids = {}, {}
            floor = start_floor_proxy(direct, server)
            procs.append(floor.proc)
            urls["floor uvicorn"], pids["floor uvicorn"] = floor.wait_ready("/readyz"), floor.pid
            if "granian" in stacks:
                proc, urls["floor granian"] = start_granian(
                    "loadtests.floor_proxy:app_from_env", {"SPEEDGATE_FLOOR_UPSTREAM": direct},
                    server, Path(tmp) / "floor-granian.log")
                procs.append(proc)
                pids["floor granian"] = proc.pid
            if "pyreqwest" in stacks:
                srv = start_pyreqwest("floor", direct, server, Path(tmp) / "floor-pyreqwest.log")
                procs.append(srv.proc)
                urls["floor pyreqwest"], pids["floor pyreqwest"] = (
                    srv.wait_ready("/readyz"), srv.pid)
            gw = start_gateway(str(cfg), str(Path(tmp) / "gw.log"), cpus=server)
            procs.append(gw.proc)
            urls["speedgate uvicorn"] = gw.wait_ready("/readyz", timeout_s=60)
            pids["speedgate uvicorn"] = gw.pid
            if "granian" in stacks:
                proc, urls["speedgate granian"] = start_granian(
                    "gateway.app:create_app_from_env", {"SPEEDGATE_CONFIG": str(cfg)}, server,
                    Path(tmp) / "gw-granian.log")
                procs.append(proc)
                pids["speedgate granian"] = proc.pid
            if "pyreqwest" in stacks:
                srv = start_pyreqwest("gateway", str(cfg), server, Path(tmp) / "gw-pyreqwest.log")
                procs.append(srv.proc)
                urls["speedgate pyreqwest"] = srv.wait_ready("/readyz", timeout_s=60)
                pids["speedgate pyreqwest"] = srv.pid
            rows = asyncio.run(measure(args, urls, pids))  # bench_relay_events's cells
        finally:
            stop_processes(procs)
    summary = {kind: {t: {"us_per_request": statistics.median(
        r["us_per_request"] for r in rows if r["kind"] == kind and r["target"] == t),
        "p99_ms": statistics.median(r["p99_ms"] for r in rows
                                    if r["kind"] == kind and r["target"] == t)}
        for t in urls} for kind in KINDS}  # fmt: skip
    errors = {f"{r['kind']} {r['target']} r{r['round']}": r["errors"] for r in rows if r["errors"]}
    if args.json:
        print(json.dumps({"summary": summary, "rows": rows, "errors": errors,
                          "loadavg": os.getloadavg()}))
    else:
        print(f"{args.chunks} chunks per stream, c={args.concurrency}; load average "
              f"{os.getloadavg()[0]:.2f}\n| kind | target | CPU µs per request | p99 ms |\n"
              "|---|---|---|---|")
        for kind, ts in summary.items():
            for t, v in ts.items():
                print(f"| {kind} | {t} | {v['us_per_request']:,.0f} | {v['p99_ms']:.2f} |")
        for name, err in errors.items():
            print(f"errors {name}: {err}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
