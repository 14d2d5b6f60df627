"""Long prompts beside small requests: a growing agent session and the small requests around it.

Setup, side by side in one run: the raw zero-delay engine (``loadtests.raw_engine``, 16-chunk
answers; it reads a body's bytes without parsing them) and this process's load generator share
one core; each target under test has the other core (``os.sched_setaffinity``, when there are
two or more CPUs; ``--no-pin`` turns it off). Targets (``--targets``, any of):

- ``direct``: the engine itself (its figures are the floor; its "server CPU" is the engine's);
- ``floor``: ``loadtests.floor_proxy``, the gateway's HTTP stack passing bodies through;
- ``speedgate``: the gateway of this checkout (``bench_capacity_core.gateway_config``);
- ``smg``: SGLang's Rust model gateway (``pip install smg`` into ``--smg-venv``, created when
  missing) as a plain HTTP router in front of the one engine: ``smg launch --worker-urls URL
  --backend openai --policy round_robin``. When it cannot be installed or started, one line
  says why and the run goes on without it.

The agent session: a conversation that grows by ``--step-tokens`` per turn (one user message of
that many tokens at ``CHARS_PER_TOKEN`` characters each, then a short assistant reply) up to
``--max-tokens``, then starts again; every turn sends the whole conversation (non-streaming,
``max_tokens: 16``). The small request: ``_common.chat_body`` (two short messages,
non-streaming), one at a time, back to back. Phases per target, ``--duration-s`` each:

1. ``alone``: small requests only: p50, p99, max latency;
2. ``long``: session turns only, back to back: turn latency p50, p50 of the largest turns,
   and the target's CPU (user + system, its children included; psutil) per turn and per MB
   of request body;
3. ``b2b``: the session back to back beside the small requests;
4. ``rate``: the session at ``--rate`` turns per second (started on a clock whatever the
   answers do) beside the small requests.

In 3 and 4: small-request p50/p99 and the longest stall (the slowest small request), and the
session's turn latency. Derived: latency added at the largest turn (its p50 minus direct's),
small p99 beside / alone, and ratios against ``smg`` and ``direct``. Exit status 1 when any
request failed (every failure is counted by kind and printed).

Run::

    .venv/bin/python -m loadtests.bench_long_prompts                       # ~3 minutes
    .venv/bin/python -m loadtests.bench_long_prompts --quick --targets direct,floor,speedgate
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import yaml

from engines.procs import die_with_parent, free_port
from loadtests._common import (
    aiohttp_request,
    chat_body,
    closed_loop,
    install_loop,
    median,
    new_session,
    pct,
    raise_on_sigterm,
    start_floor_proxy,
    start_gateway,
    start_raw_engine,
    stop_processes,
    wait_ready,
)
from loadtests.bench_capacity_core import SERVED, gateway_config, tree_cpu_s
from loadtests.bench_overhead import MODEL
from loadtests.bench_race import open_loop

TARGETS = ("direct", "floor", "speedgate", "smg")
PHASES = ("b2b", "rate")
CHARS_PER_TOKEN = 4  # the usual estimate for English and code with BPE tokenizers
DEFAULT_SMG_VENV = Path(__file__).resolve().parent / ".venv-smg"
SMG_START_TRIES = 3  # each on fresh ports, when one was taken meanwhile
WORDS = ("def", "return", "self", "import", "config", "value", "error", "request", "the",
         "build", "log", "test", "assert", "None", "await", "async", "for", "in", "if", "path")


class SmgError(RuntimeError):
    """smg could not be installed or started (the message says why)."""


def ensure_smg(venv: Path) -> Path:
    """The ``smg`` executable in ``venv``; creates the venv and runs ``pip install smg`` there
    first when missing. Raises ``SmgError`` with pip's output."""
    exe = venv / "bin" / "smg"
    if exe.exists():
        return exe
    print(f"installing smg into {venv} (first run only)...", file=sys.stderr, flush=True)
    for cmd in ([sys.executable, "-m", "venv", str(venv)],
                [str(venv / "bin" / "pip"), "install", "--quiet", "smg"]):
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise SmgError(f"{' '.join(cmd)} failed (status {r.returncode}): "
                           f"{(r.stdout + r.stderr)[-2000:]}")
    if not exe.exists():
        raise SmgError(f"pip install smg left no {exe}")
    return exe


def start_smg(venv: Path, worker_url: str, log_path: Path, cpus: set[int] | None,
              procs: list[Any]) -> tuple[subprocess.Popen, str]:
    """Start ``smg launch`` as an HTTP router in front of the OpenAI-compatible engine at
    ``worker_url``, pinned to ``cpus``, output in ``log_path``; appended to ``procs`` (the
    caller stops it). smg cannot bind port 0 and report it, so its ports (HTTP, Prometheus)
    are found free just before and, when taken meanwhile, it starts again on fresh ones.
    Returns the process and its URL once ``/health`` answers. Raises ``SmgError``."""
    exe = ensure_smg(venv)

    def setup() -> None:
        die_with_parent()
        if cpus:
            os.sched_setaffinity(0, cpus)

    for attempt in range(1, SMG_START_TRIES + 1):
        port = free_port()
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [str(exe), "launch", "--host", "127.0.0.1", "--port", str(port),
                 "--worker-urls", worker_url, "--backend", "openai", "--policy", "round_robin",
                 "--log-level", "warn", "--prometheus-host", "127.0.0.1",
                 "--prometheus-port", str(free_port()), "--max-payload-size", str(64 << 20)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=setup,
            )
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(url, proc, "/health", timeout_s=60)
            return proc, url
        except RuntimeError as e:
            stop_processes([proc])
            text = log_path.read_text(errors="replace")
            if attempt < SMG_START_TRIES and "in use" in text.lower():
                procs.remove(proc)
                continue
            raise SmgError(f"smg did not start: {e}: {text[-1500:]}") from None
    raise SmgError("smg did not start")


def session_bodies(step_tokens: int, max_tokens: int, seed: int = 7) -> list[bytes]:
    """The session's turns, pre-encoded: turn ``k`` (0-based) carries ``(k + 1) *
    step_tokens`` tokens of user text (``CHARS_PER_TOKEN`` characters each, words drawn from
    ``WORDS`` with a fixed seed) and the short assistant replies between them."""
    rnd = random.Random(seed)
    msgs: list[dict[str, str]] = [{"role": "system", "content": "You are a coding agent."}]
    out = []
    for k in range(max(1, max_tokens // step_tokens)):
        text, n = [], 0
        while n < step_tokens * CHARS_PER_TOKEN:
            w = rnd.choice(WORDS)
            text.append(w)
            n += len(w) + 1
        msgs.append({"role": "user", "content": f"turn {k}: " + " ".join(text)})
        out.append(orjson.dumps({"model": MODEL, "messages": msgs, "max_tokens": 16}))
        msgs.append({"role": "assistant", "content": f"Done with turn {k}."})
    return out


def tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and its children; NaN once it is gone."""
    try:
        return tree_cpu_s(pid)
    except Exception:
        return float("nan")


class Setup:
    """The engine and the targets, started and stopped together."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.tmp = tempfile.TemporaryDirectory(prefix="speedgate-long-")
        self.procs: list[Any] = []
        self.urls: dict[str, str] = {}
        self.pids: dict[str, int] = {}
        self.skipped: dict[str, str] = {}
        self.server_cpus: set[int] | None = None

    def start(self) -> None:
        a = self.args
        cpus = sorted(os.sched_getaffinity(0))
        loadgen = None
        if a.pin and len(cpus) >= 2:
            self.server_cpus, loadgen = {cpus[0]}, set(cpus[1:])
            os.sched_setaffinity(0, loadgen)
        engine = start_raw_engine(SERVED, 16, loadgen)
        self.procs.append(engine.proc)
        self.urls["direct"] = engine.wait_ready("/health")
        self.pids["direct"] = engine.pid
        tmp = Path(self.tmp.name)
        if "speedgate" in a.targets:
            cfg = tmp / "gateway.yaml"
            cfg.write_text(yaml.safe_dump(gateway_config(self.urls["direct"])))
            gw = start_gateway(str(cfg), str(tmp / "speedgate.log"), cpus=self.server_cpus)
            self.procs.append(gw.proc)
            try:
                self.urls["speedgate"] = gw.wait_ready("/readyz", timeout_s=60)
            except RuntimeError as e:
                log = (tmp / "speedgate.log").read_text(errors="replace")
                raise RuntimeError(f"speedgate did not start: {e}\n{log[-3000:]}") from None
            self.pids["speedgate"] = gw.pid
        if "floor" in a.targets:
            floor = start_floor_proxy(self.urls["direct"], self.server_cpus)
            self.procs.append(floor.proc)
            self.urls["floor"] = floor.wait_ready("/readyz")
            self.pids["floor"] = floor.pid
        if "smg" in a.targets:
            try:
                proc, url = start_smg(Path(a.smg_venv), self.urls["direct"], tmp / "smg.log",
                                      self.server_cpus, self.procs)
                self.urls["smg"], self.pids["smg"] = url, proc.pid
            except SmgError as e:
                self.skipped["smg"] = str(e).splitlines()[0][:300]
                print(f"bench_long_prompts: smg left out: {self.skipped['smg']}",
                      file=sys.stderr, flush=True)
        time.sleep(0.5)  # start-up settles (a first health probe)

    def stop(self) -> None:
        stop_processes(self.procs)
        self.tmp.cleanup()

    def targets(self) -> list[str]:
        return [t for t in TARGETS if t in self.args.targets and t in self.urls]

    def url(self, target: str) -> str:
        return self.urls[target] + "/v1/chat/completions"


def lat_summary(lat: list[float]) -> dict[str, Any]:
    """p50, p99 and max of latencies given in seconds, in ms; ``n`` the count."""
    return {"n": len(lat), "p50_ms": round(pct(lat, 0.5) * 1e3, 3),
            "p99_ms": round(pct(lat, 0.99) * 1e3, 3),
            "max_ms": round(max(lat) * 1e3, 3) if lat else float("nan")}


async def run_session(reqs: list[Any], duration_s: float, rate: float | None,
                      errors: Counter) -> list[tuple[int, float]]:
    """Send the session's turns (``reqs[k]`` sends turn ``k``; cycling) back to back, or at
    ``rate`` turns/s on a clock, for ``duration_s``; (turn index, latency s) per turn."""
    done: list[tuple[int, float]] = []
    if rate is None:
        end = time.perf_counter() + duration_s
        k = 0
        while time.perf_counter() < end:
            res = await reqs[k % len(reqs)]()
            if isinstance(res, str):
                errors[res] += 1
            else:
                done.append((k % len(reqs), res[0]))
            k += 1
        return done
    counter = iter(range(10**9))

    async def one() -> tuple[float, None] | str:
        k = next(counter) % len(reqs)
        res = await reqs[k]()
        if not isinstance(res, str):
            done.append((k, res[0]))
        return res

    cell = await open_loop(one, rate, duration_s, cap=16)
    errors.update(cell.errors)
    return done


def long_summary(turns: list[tuple[int, float]], n_sizes: int) -> dict[str, Any]:
    """Turn latency p50 over all turns and over the largest ones (ms)."""
    largest = [t for k, t in turns if k == n_sizes - 1]
    return {"turns": len(turns), "p50_ms": round(pct([t for _, t in turns], 0.5) * 1e3, 3),
            "largest_p50_ms": round(pct(largest, 0.5) * 1e3, 3), "largest_turns": len(largest)}


async def measure_target(setup: Setup, target: str, bodies: list[bytes]) -> dict[str, Any]:
    a = setup.args
    errors: Counter = Counter()
    out: dict[str, Any] = {}
    async with new_session() as s:
        url = setup.url(target)
        small = aiohttp_request(s, url, chat_body(MODEL, False), False)
        reqs = [aiohttp_request(s, url, b, False) for b in bodies]
        await closed_loop(small, 1, a.warmup)
        await reqs[0]()
        cell = await closed_loop(small, 1, a.duration_s)
        errors.update(cell.errors)
        out["alone"] = lat_summary(cell.lat)
        pid = setup.pids[target]
        c0 = tree_cpu(pid)
        turns = await run_session(reqs, a.duration_s, None, errors)
        cpu = tree_cpu(pid) - c0
        mb = sum(len(bodies[k]) for k, _ in turns) / 1e6
        out["long"] = {**long_summary(turns, len(bodies)), "mb": round(mb, 3),
                       "cpu_ms_per_turn": round(cpu * 1e3 / max(1, len(turns)), 3),
                       "cpu_ms_per_mb": round(cpu * 1e3 / mb, 3) if mb else float("nan")}
        for phase in PHASES:
            rate = a.rate if phase == "rate" else None
            turns, cell = await asyncio.gather(
                run_session(reqs, a.duration_s, rate, errors), closed_loop(small, 1, a.duration_s))
            errors.update(cell.errors)
            out[phase] = {"small": lat_summary(cell.lat), "long": long_summary(turns, len(bodies))}
            out[phase]["p99_beside_over_alone"] = round(
                out[phase]["small"]["p99_ms"] / out["alone"]["p99_ms"], 3)
    out["errors"] = dict(errors)
    if not a.quiet:
        print(f"  {target:9} alone p99 {out['alone']['p99_ms']:.2f} ms | long p50 "
              f"{out['long']['p50_ms']:.1f} ms cpu/turn {out['long']['cpu_ms_per_turn']:.1f} ms"
              f" | b2b p99 {out['b2b']['small']['p99_ms']:.2f} max "
              f"{out['b2b']['small']['max_ms']:.1f} ms | errors {sum(errors.values())}",
              file=sys.stderr, flush=True)
    return out


def derive(res: dict[str, Any]) -> None:
    """Latency added at the largest turn (vs direct) and ratios vs smg and direct, in place."""
    t = res["targets"]
    d = t.get("direct")
    for x in t.values():
        x["added_largest_ms"] = (round(x["long"]["largest_p50_ms"] - d["long"]["largest_p50_ms"], 3)
                                 if d else float("nan"))
    ratios: dict[str, dict[str, float]] = {}
    for ref in ("smg", "direct"):
        if ref not in t:
            continue
        r = t[ref]
        for name, x in t.items():
            if name == ref:
                continue
            q = ratios.setdefault(f"{name}/{ref}", {})
            pairs = {
                "largest_turn_p50": (x["long"]["largest_p50_ms"], r["long"]["largest_p50_ms"]),
                "small_p99_b2b": (x["b2b"]["small"]["p99_ms"], r["b2b"]["small"]["p99_ms"]),
                "longest_stall_b2b": (x["b2b"]["small"]["max_ms"], r["b2b"]["small"]["max_ms"]),
                "cpu_per_turn": (x["long"]["cpu_ms_per_turn"], r["long"]["cpu_ms_per_turn"]),
            }
            if ref == "smg":
                pairs["added_largest"] = (x["added_largest_ms"], r["added_largest_ms"])
            for k, (num, den) in pairs.items():
                q[k] = round(num / den, 3) if den and den == den and num == num else float("nan")
    res["ratios"] = ratios


ROWS: tuple[tuple[str, Any], ...] = (
    ("small p50 alone (ms)", lambda x: x["alone"]["p50_ms"]),
    ("small p99 alone (ms)", lambda x: x["alone"]["p99_ms"]),
    ("small p99 beside, back to back (ms)", lambda x: x["b2b"]["small"]["p99_ms"]),
    ("small p99 beside / alone, back to back", lambda x: x["b2b"]["p99_beside_over_alone"]),
    ("longest small stall, back to back (ms)", lambda x: x["b2b"]["small"]["max_ms"]),
    ("small p99 beside, fixed rate (ms)", lambda x: x["rate"]["small"]["p99_ms"]),
    ("small p99 beside / alone, fixed rate", lambda x: x["rate"]["p99_beside_over_alone"]),
    ("longest small stall, fixed rate (ms)", lambda x: x["rate"]["small"]["max_ms"]),
    ("long turn p50, alone (ms)", lambda x: x["long"]["p50_ms"]),
    ("largest turn p50, alone (ms)", lambda x: x["long"]["largest_p50_ms"]),
    ("added at the largest turn vs direct (ms)", lambda x: x["added_largest_ms"]),
    ("long turn p50 beside small, back to back (ms)", lambda x: x["b2b"]["long"]["p50_ms"]),
    ("server CPU per long turn (ms)", lambda x: x["long"]["cpu_ms_per_turn"]),
    ("server CPU per MB of body (ms)", lambda x: x["long"]["cpu_ms_per_mb"]),
    ("long turns sent, alone / b2b / rate", lambda x: f"{x['long']['turns']} / "
     f"{x['b2b']['long']['turns']} / {x['rate']['long']['turns']}"),
)


def _fmt(v: Any) -> str:
    if isinstance(v, str):
        return v
    if v is None or v != v:
        return "-"
    return f"{v:,.2f}" if abs(v) < 100 else f"{v:,.0f}"


def print_report(res: dict[str, Any]) -> None:
    s = res["settings"]
    names = list(res["targets"])
    print(f"\nLong prompts beside small requests: a session growing by {s['step_tokens']:,} "
          f"tokens per turn to {s['max_tokens']:,} ({s['largest_turn_mb']:.2f} MB at the "
          f"largest turn), {s['duration_s']} s per phase, fixed rate {s['rate']}/s; pin="
          f"{s['pin']} cpus={s['cpus']} Python {s['python']}"
          + (f"; smg {s['smg_version']}" if "smg" in names else ""))
    print("\n| | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for label, get in ROWS:
        print(f"| {label} | " + " | ".join(_fmt(get(res["targets"][n])) for n in names) + " |")
    if res["ratios"]:
        keys = sorted({k for q in res["ratios"].values() for k in q})
        print("\n| ratio | " + " | ".join(keys) + " |")
        print("|---|" + "---|" * len(keys))
        for pair, q in res["ratios"].items():
            print(f"| {pair} | " + " | ".join(_fmt(q.get(k)) for k in keys) + " |")
    for name, why in res["skipped"].items():
        print(f"\n{name} left out: {why}")
    if res["errors"]:
        print(f"\nERRORS: {res['errors']}")
    else:
        print("\nno request errors")


def smg_version(venv: Path) -> str:
    try:
        r = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import importlib.metadata as m; print(m.version('smg'))"],
                           capture_output=True, text=True, timeout=30)
        return r.stdout.strip() or "?"
    except (OSError, subprocess.TimeoutExpired):
        return "?"


async def run_all(setup: Setup, bodies: list[bytes]) -> dict[str, Any]:
    a = setup.args
    res: dict[str, Any] = {"targets": {}}
    for t in setup.targets():
        res["targets"][t] = await measure_target(setup, t, bodies)
    derive(res)
    res["settings"] = {
        "max_tokens": a.max_tokens, "step_tokens": a.step_tokens, "duration_s": a.duration_s,
        "rate": a.rate, "pin": bool(a.pin), "cpus": os.cpu_count(),
        "server_cpus": sorted(setup.server_cpus or []), "python": platform.python_version(),
        "largest_turn_mb": round(len(bodies[-1]) / 1e6, 3),
        "mean_turn_mb": round(median([len(b) / 1e6 for b in bodies]), 3),
        "smg_version": smg_version(Path(a.smg_venv)) if "smg" in setup.urls else None,
        "quick": bool(a.quick),
    }
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-tokens", type=int, default=1_000_000, help="largest session turn")
    p.add_argument("--step-tokens", type=int, default=100_000, help="tokens added per turn")
    p.add_argument("--duration-s", type=float, default=8.0, help="seconds per phase")
    p.add_argument("--rate", type=float, default=2.0, help="session turns/s, fixed-rate phase")
    p.add_argument("--warmup", type=float, default=0.3)
    p.add_argument("--targets", default=",".join(TARGETS), help="comma-separated, of: "
                   + ", ".join(TARGETS))
    p.add_argument("--smg-venv", default=str(DEFAULT_SMG_VENV))
    p.add_argument("--no-pin", dest="pin", action="store_false")
    p.add_argument("--quick", action="store_true", help="tiny sizes, short phases (tests)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quiet", action="store_true", help="no per-target progress on stderr")
    a = p.parse_args(argv)
    a.targets = [t.strip() for t in a.targets.split(",") if t.strip()]
    unknown = set(a.targets) - set(TARGETS)
    if unknown:
        p.error(f"unknown targets {sorted(unknown)}; known: {', '.join(TARGETS)}")
    if a.quick:
        a.max_tokens, a.step_tokens, a.duration_s, a.warmup, a.rate = 6000, 2000, 0.8, 0.1, 10
    bodies = session_bodies(a.step_tokens, a.max_tokens)
    install_loop()
    raise_on_sigterm()
    setup = Setup(a)
    try:
        setup.start()
        res = asyncio.run(run_all(setup, bodies))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        setup.stop()
    res["skipped"] = setup.skipped
    res["pids"] = [p.pid for p in setup.procs]
    res["errors"] = {t: x["errors"] for t, x in res["targets"].items() if x["errors"]}
    if a.json:
        print(json.dumps(res))
    else:
        print_report(res)
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
