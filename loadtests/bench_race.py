"""The race: the same load direct to the engine, through speedgate, and through LiteLLM's proxy.

Method: one zero-delay engine simulator (``python -m engines.sim --time-scale 0``, model
``bench``, 64-token answers) and a speedgate gateway process in front of it are started as in
``loadtests/bench_overhead.py`` (its ``Bench`` class: log level warning, no access log); a
LiteLLM proxy (``litellm --config``, from its own virtual environment ``--litellm-venv``,
created with ``pip install 'litellm[proxy]'`` when missing) is configured with the same
simulator as an OpenAI-compatible backend (``model: openai/bench``, ``api_base``) and the
settings of LiteLLM's "Best Practices for Production" page: a master key, ``set_verbose:
false``, ``json_logs: true``, ``request_timeout: 600``, ``LITELLM_LOG=ERROR``,
``LITELLM_MODE=PRODUCTION``, no database (so no spend/error logs), and one uvicorn worker per
instance (the page's suggested command for Kubernetes). Both servers run ``--workers`` worker
processes (default 1; speedgate through ``SPEEDGATE_SERVER__WORKERS``, LiteLLM through
``--num_workers``). This process is the load generator (uvloop, one lean aiohttp session per
cell, from ``loadtests/_common.py``); ``--pin`` pins it to one core and the servers to the
others.

Phases, every cell repeated ``--repeats`` times with the target order rotated each round:

1. closed loop: ``N`` workers send requests back to back for ``--duration`` s (after a warm-up)
   at each ``--concurrency``, non-streaming and streaming (the whole SSE stream is read); max
   RPS of a target = its best median rps over the concurrencies;
2. fixed rate (open loop, requests started on a clock whatever the answers do) at half of
   speedgate's max RPS for direct and speedgate: the latency speedgate adds there (LiteLLM is
   run at half of its own max RPS, as it cannot keep up with speedgate's);
3. inter-token latency: streams whose chunks the simulator spaces ``--itl-interval-ms`` apart
   (per-request ``sim_faults.chunk_interval_s``), ``--itl-concurrency`` at once; the p50/p99 gap
   between content chunks seen by the client, per target (LiteLLM too when it forwards the
   field; its row says when it did not).

The table shows medians over rounds; ratios are speedgate/LiteLLM and speedgate/direct rps.
Errors are counted per cell and printed; any error makes the exit status 1. ``--quick`` runs a
short version (one concurrency, one round, about 40 s plus LiteLLM's start) that still yields
every row. ``--json`` prints one JSON object with every figure. ``--profile DIR`` records the
gateway with py-spy during the run (``DIR/gateway.pyspy.txt``, collapsed stacks, and
``DIR/hotspots.txt``: top functions by own and total samples; ``--nonblocking``, but the
sampling still costs CPU: do not read the race figures of a profiled run). If LiteLLM cannot
be installed or started, the script exits with status 3 and says why (the error text).

Ports: the simulator and speedgate bind port 0 and report the port they got. LiteLLM cannot
report its port, so it is started on a port found free just before and, if another process
took that port meanwhile ("address already in use"), started again on a fresh one (3 tries).

Run (defaults take about 4 minutes)::

    .venv/bin/python -m loadtests.bench_race
    .venv/bin/python -m loadtests.bench_race --quick --json
    .venv/bin/python -m loadtests.bench_race --pin --concurrency 8 64 --profile /tmp/prof
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import orjson
import yaml

from engines.procs import die_with_parent, free_port
from loadtests._common import (
    Cell,
    aiohttp_request,
    chat_body,
    closed_loop,
    cpu_seconds,
    install_loop,
    median,
    new_session,
    pct,
    raise_on_sigterm,
    stop_processes,
    wait_ready,
)
from loadtests.bench_overhead import MODEL, Bench, _agg, scan_log

TARGETS = ("direct", "speedgate", "litellm")
MODES = ("non-stream", "stream")
LITELLM_KEY = "sk-bench-race"
IDLE_LEAVES = ("Runner.run (asyncio/runners.py", "_worker (concurrent/futures/thread.py")
DEFAULT_VENV = Path(__file__).resolve().parent / ".venv-litellm"
LITELLM_START_TRIES = 3  # each on a fresh port, when the last one was taken meanwhile


class LiteLLMError(RuntimeError):
    """LiteLLM could not be installed or started (the message says why)."""


def ensure_litellm(venv: Path, log: Any = sys.stderr) -> Path:
    """The ``litellm`` executable in ``venv``; creates the venv and installs
    ``litellm[proxy]`` there first when missing. Raises ``LiteLLMError`` with pip's output."""
    exe = venv / "bin" / "litellm"
    if exe.exists():
        return exe
    print(f"installing litellm[proxy] into {venv} (first run only)...", file=log, flush=True)
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [str(venv / "bin" / "pip"), "install", "--quiet", "litellm[proxy]"],
    ]
    for cmd in steps:
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise LiteLLMError(
                f"{' '.join(cmd)} failed (status {r.returncode}):\n{(r.stdout + r.stderr)[-3000:]}"
            )
    if not exe.exists():
        raise LiteLLMError(f"pip install 'litellm[proxy]' left no {exe}")
    return exe


def start_litellm(
    venv: Path, api_base: str, workdir: Path, log_path: Path, *, cpus: set[int] | None,
    workers: int, progress: Any, procs: list[Any],
) -> tuple[subprocess.Popen, str]:
    """Start LiteLLM's proxy (installed into ``venv`` when missing) in front of the engine at
    ``api_base`` (served model ``MODEL``), ``workers`` uvicorn workers, pinned to ``cpus``,
    its output in ``log_path``, its config in ``workdir``; appended to ``procs`` (stopped by
    the caller). Returns the process and its URL once ``/health/liveliness`` answers. Raises
    ``LiteLLMError`` when it cannot be installed or started."""
    exe = ensure_litellm(venv)
    cfg = {
        "model_list": [{
            "model_name": MODEL,
            "litellm_params": {
                "model": f"openai/{MODEL}",
                "api_base": api_base + "/v1",
                "api_key": "sk-unused",
            },
        }],
        "general_settings": {"master_key": LITELLM_KEY},
        "litellm_settings": {"request_timeout": 600, "set_verbose": False, "json_logs": True},
    }  # fmt: skip
    cfg_path = workdir / "litellm.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "LITELLM_LOG": "ERROR", "LITELLM_MODE": "PRODUCTION",
           "PYTHONUNBUFFERED": "1"}
    env.pop("SPEEDGATE_SERVER__WORKERS", None)

    def setup() -> None:
        die_with_parent()
        if cpus:
            os.sched_setaffinity(0, cpus)

    def log_text() -> str:
        try:
            return log_path.read_text(errors="replace")
        except OSError:
            return ""

    # LiteLLM's proxy binds --port 0 but never says which port it got (its log is at
    # LITELLM_LOG=ERROR), so it gets a port found free here; when another process took that
    # port before LiteLLM bound it ("address already in use"), it starts again on a fresh
    # one, LITELLM_START_TRIES times at most.
    for attempt in range(1, LITELLM_START_TRIES + 1):
        port = free_port()
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [str(exe), "--config", str(cfg_path), "--host", "127.0.0.1",
                 "--port", str(port), "--num_workers", str(workers)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=setup, env=env, cwd=str(workdir),
            )
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(url, proc, "/health/liveliness", timeout_s=180)
            return proc, url
        except RuntimeError as e:
            stop_processes([proc])
            text = log_text()
            if attempt < LITELLM_START_TRIES and "address already in use" in text.lower():
                procs.remove(proc)
                progress(f"  LiteLLM: port {port} taken meanwhile, retrying")
                continue
            raise LiteLLMError(f"LiteLLM proxy did not start: {e}\n{text[-3000:]}") from None
    raise LiteLLMError("LiteLLM proxy did not start")


class Race(Bench):
    """``Bench`` (simulator + speedgate) plus a LiteLLM proxy on the same simulator."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.ll_url = ""
        self.ll_pid = 0
        self.ll_log = Path(self.tmp.name) / "litellm.log"
        self.profiler: subprocess.Popen | None = None

    def start(self) -> None:
        os.environ["SPEEDGATE_SERVER__WORKERS"] = str(self.args.workers)
        super().start()  # simulator + speedgate, pinning
        proc, self.ll_url = start_litellm(
            Path(self.args.litellm_venv), self.sim_url, Path(self.tmp.name), self.ll_log,
            cpus=self.server_cpus, workers=self.args.workers,
            progress=lambda text: _progress(self.args, text), procs=self.procs,
        )
        self.ll_pid = proc.pid
        if self.args.profile:
            self.start_profiler(Path(self.args.profile))

    def start_profiler(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        pyspy = Path(sys.executable).parent / "py-spy"
        self.profiler = subprocess.Popen(
            [str(pyspy), "record", "--pid", str(self.gw_pid), "--format", "raw", "--rate", "250",
             "--nonblocking",
             "--subprocesses", "--output", str(out / "gateway.pyspy.txt")],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True,
        )

    def stop_profiler(self) -> None:
        if self.profiler is not None and self.profiler.poll() is None:
            self.profiler.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
            try:
                self.profiler.wait(30)
            except subprocess.TimeoutExpired:
                stop_processes([self.profiler])

    def litellm_log(self) -> str:
        try:
            return self.ll_log.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        self.stop_profiler()
        super().stop()

    def target_url(self, target: str) -> str:
        base = {"direct": self.sim_url, "speedgate": self.gw_url, "litellm": self.ll_url}[target]
        return base + "/v1/chat/completions"

    def headers(self, target: str) -> dict[str, str] | None:
        return {"Authorization": f"Bearer {LITELLM_KEY}"} if target == "litellm" else None

    def server_pid(self, target: str) -> int:
        return {"direct": 0, "speedgate": self.gw_pid, "litellm": self.ll_pid}[target]


def tree_cpu(pid: int) -> float | None:
    """CPU seconds of ``pid`` and its children (worker processes)."""
    if not pid:
        return None
    try:
        import psutil

        p = psutil.Process(pid)
        procs = [p, *p.children(recursive=True)]
        return sum(sum(x.cpu_times()[:2]) for x in procs if x.is_running())
    except Exception:
        return cpu_seconds(pid)


async def open_loop(request: Any, rate: float, duration_s: float, cap: int = 2000) -> Cell:
    """Start requests on a fixed clock (``rate``/s) for ``duration_s``, whatever the answers
    do; more than ``cap`` in flight counts as an ``overload`` error instead of a request."""
    cell = Cell()
    inflight = 0
    tasks: set[asyncio.Task] = set()

    async def one() -> None:
        nonlocal inflight
        inflight += 1
        try:
            res = await request()
        except Exception as e:
            cell.errors[type(e).__name__] += 1
            return
        finally:
            inflight -= 1
        if isinstance(res, str):
            cell.errors[res] += 1
            return
        cell.ok += 1
        cell.lat.append(res[0])

    t0 = time.perf_counter()
    n = max(1, int(rate * duration_s))
    for i in range(n):
        delay = t0 + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if inflight >= cap:
            cell.errors["overload"] += 1
            continue
        t = asyncio.create_task(one())
        tasks.add(t)
        t.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)
    cell.elapsed_s = time.perf_counter() - t0
    return cell


def itl_request(session: Any, url: str, body: bytes, headers: dict[str, str] | None,
                gaps: list[float]) -> Any:
    """A streaming request that appends the gaps between content chunks to ``gaps``."""
    hdrs = {"Content-Type": "application/json", **(headers or {})}

    async def one() -> tuple[float, float | None] | str:
        t0 = time.perf_counter()
        async with session.post(url, data=body, headers=hdrs) as r:
            if r.status != 200:
                await r.read()
                return f"http {r.status}"
            last = None
            mine: list[float] = []
            done = False
            async for line in r.content:
                if line.startswith(b"data: [DONE]"):
                    done = True
                elif line.startswith(b"data: ") and b'"content":"' in line and (
                    b'"content":""' not in line
                ):
                    now = time.perf_counter()
                    if last is not None:
                        mine.append(now - last)
                    last = now
            if not done:
                return "no [DONE]"
            gaps.extend(mine)
            return time.perf_counter() - t0, None

    return one


def _progress(args: argparse.Namespace, text: str) -> None:
    if not args.quiet:
        print(text, file=sys.stderr, flush=True)


def _rotate(rep: int) -> tuple[str, ...]:
    k = rep % len(TARGETS)
    return TARGETS[k:] + TARGETS[:k]


async def phase_closed(race: Race) -> list[dict[str, Any]]:
    a = race.args
    cells: dict[tuple[str, int, str], list[Cell]] = defaultdict(list)
    cpu: dict[tuple[str, int, str], list[float]] = defaultdict(list)
    for rep in range(a.repeats):
        for mode in MODES:
            stream = mode == "stream"
            body = chat_body(MODEL, stream)
            for conc in a.concurrency:
                for target in _rotate(rep):
                    async with new_session() as s:
                        req = aiohttp_request(
                            s, race.target_url(target), body, stream, race.headers(target)
                        )
                        await closed_loop(req, conc, a.warmup)
                        c0 = tree_cpu(race.server_pid(target))
                        cell = await closed_loop(req, conc, a.duration)
                        c1 = tree_cpu(race.server_pid(target))
                    cells[(mode, conc, target)].append(cell)
                    if c0 is not None and c1 is not None and cell.ok:
                        cpu[(mode, conc, target)].append((c1 - c0) / cell.ok * 1e6)
                    s_ = cell.summary()
                    _progress(a, f"  closed r{rep + 1} {mode:10} c={conc:<3} {target:9} "
                                 f"{s_['rps']:8.1f} req/s p50 {s_['p50_ms']:7.2f} ms "
                                 f"p99 {s_['p99_ms']:8.2f} ms errors {sum(cell.errors.values())}")
    rows = []
    for mode in MODES:
        for conc in a.concurrency:
            row: dict[str, Any] = {"mode": mode, "concurrency": conc}
            for t in TARGETS:
                row[t] = _agg(cells[(mode, conc, t)])
                c = cpu.get((mode, conc, t))
                row[t]["cpu_us_per_request"] = round(median(c), 1) if c else None
            sg, ll, d = row["speedgate"]["rps"], row["litellm"]["rps"], row["direct"]["rps"]
            row["speedgate_over_litellm"] = round(sg / ll, 2) if ll else None
            row["speedgate_over_direct"] = round(sg / d, 3) if d else None
            rows.append(row)
    return rows


def max_rps(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for mode in MODES:
        out[mode] = {t: max(r[t]["rps"] for r in rows if r["mode"] == mode) for t in TARGETS}
        ll = out[mode]["litellm"]
        out[mode]["speedgate_over_litellm"] = round(out[mode]["speedgate"] / ll, 2) if ll else None
    return out


async def phase_rate(race: Race, maxes: dict[str, dict[str, float]]) -> list[dict[str, Any]]:
    a = race.args
    rows = []
    for mode in MODES:
        stream = mode == "stream"
        body = chat_body(MODEL, stream)
        rates = {
            "direct": maxes[mode]["speedgate"] / 2,
            "speedgate": maxes[mode]["speedgate"] / 2,
            "litellm": maxes[mode]["litellm"] / 2,
        }
        cells: dict[str, list[Cell]] = defaultdict(list)
        for rep in range(a.repeats):
            for target in _rotate(rep):
                if rates[target] <= 0:
                    continue
                async with new_session() as s:
                    req = aiohttp_request(
                        s, race.target_url(target), body, stream, race.headers(target)
                    )
                    await closed_loop(req, 4, a.warmup)
                    cell = await open_loop(req, rates[target], a.rate_duration)
                cells[target].append(cell)
                s_ = cell.summary()
                _progress(a, f"  rate   r{rep + 1} {mode:10} {rates[target]:7.1f}/s {target:9} "
                             f"p50 {s_['p50_ms']:7.2f} ms p99 {s_['p99_ms']:8.2f} ms "
                             f"errors {sum(cell.errors.values())}")
        row: dict[str, Any] = {"mode": mode}
        for t in TARGETS:
            row[t] = {**_agg(cells[t]), "rate": round(rates[t], 1)} if cells[t] else None
        d, g = row["direct"], row["speedgate"]
        if d and g:
            row["speedgate_added_p50_ms"] = round(g["p50_ms"] - d["p50_ms"], 3)
            row["speedgate_added_p99_ms"] = round(g["p99_ms"] - d["p99_ms"], 3)
        rows.append(row)
    return rows


async def phase_itl(race: Race) -> dict[str, Any]:
    a = race.args
    doc = orjson.loads(chat_body(MODEL, True))
    doc["sim_faults"] = {"chunk_interval_s": a.itl_interval_ms / 1e3}
    body = orjson.dumps(doc)
    gaps: dict[str, list[list[float]]] = defaultdict(list)
    errors: dict[str, Counter] = defaultdict(Counter)
    for rep in range(a.repeats):
        for target in _rotate(rep):
            mine: list[float] = []
            async with new_session() as s:
                req = itl_request(s, race.target_url(target), body, race.headers(target), mine)
                cell = await closed_loop(req, a.itl_concurrency, a.itl_duration)
            gaps[target].append(mine)
            errors[target].update(cell.errors)
            _progress(a, f"  itl    r{rep + 1} {target:9} gaps {len(mine):6} p50 "
                         f"{pct(mine, 0.5) * 1e3:7.3f} ms p99 {pct(mine, 0.99) * 1e3:7.3f} ms "
                         f"errors {sum(cell.errors.values())}")
    out: dict[str, Any] = {"interval_ms": a.itl_interval_ms, "concurrency": a.itl_concurrency}
    for t in TARGETS:
        runs = gaps[t]
        p50 = median([pct(g, 0.5) * 1e3 for g in runs if g])
        p99 = median([pct(g, 0.99) * 1e3 for g in runs if g])
        out[t] = {"p50_ms": round(p50, 3), "p99_ms": round(p99, 3),
                  "gaps": sum(len(g) for g in runs), "errors": dict(errors[t])}
    # the interval is honoured only when the field reached the simulator
    ll = out["litellm"]
    forwarded = ll["p50_ms"] == ll["p50_ms"] and ll["p50_ms"] > a.itl_interval_ms / 2
    ll["sim_faults_forwarded"] = forwarded
    for t in ("speedgate", "litellm"):
        out[f"{t}_added_p50_ms"] = round(out[t]["p50_ms"] - out["direct"]["p50_ms"], 3)
    return out


def collect_errors(result: dict[str, Any]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for r in result["closed"]:
        for t in TARGETS:
            if r[t]["errors"]:
                out[f"closed/{t}/{r['mode']}/c={r['concurrency']}"] = r[t]["errors"]
    for r in result["rate"]:
        for t in TARGETS:
            if r[t] and r[t]["errors"]:
                out[f"rate/{t}/{r['mode']}"] = r[t]["errors"]
    for t in TARGETS:
        if result["itl"][t]["errors"]:
            out[f"itl/{t}"] = result["itl"][t]["errors"]
    return out


def _f(v: Any, fmt: str) -> str:
    return "-" if v is None or v != v else format(v, fmt)


def print_report(res: dict[str, Any]) -> None:
    s = res["settings"]
    print(f"\nRace: zero-delay simulator ({s['output_tokens']} output tokens), {s['workers']} "
          f"worker process(es) per server, {s['duration_s']} s per cell, median of "
          f"{s['repeats']} round(s); pin={s['pin']} cpus={s['cpus']} Python {s['python']}; "
          f"LiteLLM {s['litellm_version']}")
    head = (f"{'mode':10} {'conc':>4} | {'direct':>8} {'speedgate':>9} {'litellm':>8} | "
            f"{'sg/ll':>6} {'sg/d':>5} | {'p50 d':>7} {'p50 sg':>7} {'p50 ll':>8} | "
            f"{'p99 d':>7} {'p99 sg':>7} {'p99 ll':>8} | {'cpu/req sg':>10} {'ll':>8}")
    print("closed loop (req/s; latency ms; server CPU µs per request)")
    print(head)
    print("-" * len(head))
    for r in res["closed"]:
        d, g, ll = r["direct"], r["speedgate"], r["litellm"]
        print(f"{r['mode']:10} {r['concurrency']:>4} | {d['rps']:>8.1f} {g['rps']:>9.1f} "
              f"{ll['rps']:>8.1f} | {_f(r['speedgate_over_litellm'], '6.1f')} "
              f"{_f(r['speedgate_over_direct'], '5.2f')} | {d['p50_ms']:>7.2f} {g['p50_ms']:>7.2f} "
              f"{ll['p50_ms']:>8.2f} | {d['p99_ms']:>7.2f} {g['p99_ms']:>7.2f} "
              f"{ll['p99_ms']:>8.2f} | {_f(g['cpu_us_per_request'], '10.0f')} "
              f"{_f(ll['cpu_us_per_request'], '8.0f')}")
    print("\nmax RPS (best median over concurrencies)")
    for mode, m in res["max_rps"].items():
        ratio = _f(m["speedgate_over_litellm"], ".1f")
        print(f"  {mode:10} direct {m['direct']:8.1f}  speedgate {m['speedgate']:8.1f}  "
              f"litellm {m['litellm']:8.1f}  speedgate/litellm {ratio}x")
    print("\nfixed rate (open loop): direct and speedgate at half of speedgate's max RPS, "
          "LiteLLM at half of its own")
    for r in res["rate"]:
        parts = []
        for t in TARGETS:
            x = r[t]
            if x:
                parts.append(f"{t} {x['rate']:.0f}/s p50 {x['p50_ms']:.2f} p99 {x['p99_ms']:.2f}")
        print(f"  {r['mode']:10} " + " | ".join(parts)
              + f" | speedgate adds p50 {_f(r.get('speedgate_added_p50_ms'), '+.3f')} ms, "
                f"p99 {_f(r.get('speedgate_added_p99_ms'), '+.3f')} ms")
    it = res["itl"]
    print(f"\ninter-token latency: chunks {it['interval_ms']} ms apart at the simulator, "
          f"{it['concurrency']} streams")
    for t in TARGETS:
        x = it[t]
        note = ""
        if t == "litellm" and not x["sim_faults_forwarded"]:
            note = " (sim_faults not forwarded by LiteLLM: not comparable)"
        print(f"  {t:9} p50 {_f(x['p50_ms'], '.3f')} ms p99 {_f(x['p99_ms'], '.3f')} ms "
              f"({x['gaps']} gaps){note}")
    print(f"  speedgate adds p50 {_f(it['speedgate_added_p50_ms'], '+.3f')} ms")
    if res["errors"]:
        print("\nERRORS (phase/target/mode: kind -> count):")
        for where, kinds in res["errors"].items():
            print(f"  {where}: {kinds}")
    else:
        print("\nno request errors")
    print(f"speedgate log: {len(res['gateway_log_problems'])} warning/error line(s)")


def litellm_version(venv: Path) -> str:
    try:
        r = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import importlib.metadata as m; print(m.version('litellm'))"],
                           capture_output=True, text=True, timeout=30)
        return r.stdout.strip() or "?"
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def summarize_profile(raw: Path, out: Path, top: int = 30) -> str:
    """Top frames by own samples and by total samples (frames in the project's code)."""
    own: Counter = Counter()
    total: Counter = Counter()
    n = idle = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        c = int(count)
        frames = stack.split(";")
        if any(leaf in frames[-1] for leaf in IDLE_LEAVES):
            idle += c  # the event loop waiting in C (uvloop), idle thread-pool workers
            continue
        n += c
        own[frames[-1]] += c
        for f in set(frames):
            if "gateway/" in f and "(" in f:
                total[f] += c
    n = max(n, 1)
    lines = [f"py-spy samples: {n} busy ({idle} idle left out)", "", f"top {top} by own samples:"]
    lines += [f"  {c / n * 100:5.1f}%  {f}" for f, c in own.most_common(top)]
    lines += ["", f"top {top} gateway/ frames by total samples (incl. callees):"]
    lines += [f"  {c / n * 100:5.1f}%  {f}" for f, c in total.most_common(top)]
    text = "\n".join(lines) + "\n"
    out.write_text(text)
    return text


async def run_all(race: Race) -> dict[str, Any]:
    a = race.args
    closed = await phase_closed(race)
    maxes = max_rps(closed)
    rate = await phase_rate(race, maxes)
    itl = await phase_itl(race)
    return {"closed": closed, "max_rps": maxes, "rate": rate, "itl": itl,
            "settings": {
                "duration_s": a.duration, "warmup_s": a.warmup, "repeats": a.repeats,
                "concurrency": a.concurrency, "output_tokens": a.output_tokens,
                "workers": a.workers, "pin": bool(a.pin), "cpus": os.cpu_count(),
                "loadgen_cpus": sorted(race.loadgen_cpus or []),
                "server_cpus": sorted(race.server_cpus or []),
                "python": platform.python_version(), "quick": bool(a.quick),
                "rate_duration_s": a.rate_duration,
                "litellm_version": litellm_version(Path(a.litellm_venv)),
            }}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=2.5, help="seconds per closed-loop cell")
    p.add_argument("--warmup", type=float, default=0.3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--output-tokens", type=int, default=64)
    p.add_argument("--workers", type=int, default=1, help="worker processes per server")
    p.add_argument("--rate-duration", type=float, default=3.0, help="seconds per fixed-rate cell")
    p.add_argument("--itl-interval-ms", type=float, default=5.0)
    p.add_argument("--itl-concurrency", type=int, default=8)
    p.add_argument("--itl-duration", type=float, default=2.0)
    p.add_argument("--litellm-venv", default=str(DEFAULT_VENV))
    p.add_argument("--pin", action="store_true", help="load generator on 1 core, servers the rest")
    p.add_argument("--profile", default="", help="py-spy the gateway into this folder")
    p.add_argument("--quick", action="store_true", help="one concurrency (8), one short round")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quiet", action="store_true", help="no per-cell progress on stderr")
    args = p.parse_args(argv)
    if args.quick:
        args.concurrency, args.repeats, args.duration = [8], 1, 1.0
        args.rate_duration, args.itl_duration, args.warmup = 1.0, 1.0, 0.2
    args.body_mib, args.access_log = 0.0, False  # for Bench: no large-body simulator

    install_loop()
    raise_on_sigterm()
    race = Race(args)
    try:
        race.start()
        result = asyncio.run(run_all(race))
        result["gateway_log_problems"] = scan_log(race.gateway_log())
    except LiteLLMError as e:
        print(f"bench_race: LiteLLM unavailable: {e}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        race.stop()
        os.environ.pop("SPEEDGATE_SERVER__WORKERS", None)
    if args.profile:
        raw = Path(args.profile) / "gateway.pyspy.txt"
        if raw.exists():
            result["profile"] = str(raw)
            text = summarize_profile(raw, Path(args.profile) / "hotspots.txt")
            if not args.json:
                print(text)
    result["errors"] = collect_errors(result)
    if args.json:
        print(json.dumps(result))
    else:
        print_report(result)
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
