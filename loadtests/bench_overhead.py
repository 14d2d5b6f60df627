"""Gateway overhead: the same load direct to the engine and through the gateway, side by side.

Method: starts a zero-delay engine simulator (``python -m engines.sim --time-scale 0``, model
``bench``) and a gateway as a process (``python -m gateway serve``) whose config has one model
``bench`` with that simulator as its standard pool, health probes on, log level ``warning`` and
no access log (``--access-log``: level ``info`` with the access log, as in production). This
process is the load generator (uvloop + one lean aiohttp session per cell, closed loop:
``N`` workers sending requests back to back for ``--duration`` s after a short warm-up), so it
does not share an event loop with the servers. ``--pin`` pins the load generator to one core and
the servers to the others (``os.sched_setaffinity``).

For each API (``--apis``: chat completions, the Responses API, Anthropic Messages; the same
small request in each), each mode (non-streaming; streaming, reading the whole SSE stream) and
concurrency, the direct and the gateway run alternate (their order flips every round) and the
whole matrix is repeated ``--repeats`` times so that the machine's noise hits both. The table
shows medians over rounds of: requests/s, per-cell p50/p99 latency, streaming time to first
byte p50, the gateway/direct rps ratio, the p50 latency the gateway adds, and the gateway's CPU
time per request (from ``/proc``; ~1e6/rps µs means the gateway is CPU-bound on one core) and,
for the Responses and Messages rows, that CPU time relative to chat's in the same mode and
concurrency.

Large bodies (``--body-mib``, default 5; 0 skips): a second simulator (model ``bench-large``,
context limit raised) receives long conversations of that size, so their engine-side parsing
does not slow the small-request simulator. Reported: (a) large-request forwarding alone,
direct vs gateway, at ``--large-concurrency``; (b) the stall check: small non-streaming requests
at ``--stall-concurrency`` measured without, then with ``--large-concurrency`` large requests in
flight (to the large simulator, direct or through the gateway); a gateway that blocks its event
loop on a large body shows as a small-request p99 far above the direct baseline's.

Errors (non-200, exceptions, truncated streams) are counted per cell and printed; the gateway's
log is scanned for warnings, errors and tracebacks. Every process started is stopped on exit,
Ctrl-C and SIGTERM included. The exit status is 1 when any error was seen.

Run (defaults take about 3.5 minutes)::

    .venv/bin/python -m loadtests.bench_overhead
    .venv/bin/python -m loadtests.bench_overhead --pin --concurrency 1 32 --body-mib 0 --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from loadtests._common import (
    Cell,
    aiohttp_request,
    chat_body,
    closed_loop,
    cpu_seconds,
    install_loop,
    long_chat_body,
    median,
    messages_body,
    new_session,
    raise_on_sigterm,
    responses_body,
    start_gateway,
    start_sim,
    stop_processes,
)

MODEL = "bench"
LARGE_MODEL = "bench-large"
TARGETS = ("direct", "gateway")
MODES = ("non-stream", "stream")
# API -> (path, body builder, JSON answer marker, last stream event marker)
APIS: dict[str, tuple[str, Any, bytes, bytes]] = {
    "chat": ("/v1/chat/completions", chat_body, b'"choices"', b"data: [DONE]"),
    "responses": ("/v1/responses", responses_body, b'"output"', b"event: response.completed"),
    "messages": ("/v1/messages", messages_body, b'"content"', b"event: message_stop"),
}


class Bench:
    """The running servers and the load generator's settings."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.procs: list[Any] = []
        self.tmp = tempfile.TemporaryDirectory(prefix="speedgate-bench-")
        self.sim_url = ""
        self.large_sim_url = ""
        self.gw_url = ""
        self.gw_pid = 0
        self.log_path = Path(self.tmp.name) / "gateway.log"
        self.loadgen_cpus: set[int] | None = None
        self.server_cpus: set[int] | None = None

    def start(self) -> None:
        a = self.args
        if a.pin:
            cpus = sorted(os.sched_getaffinity(0))
            if len(cpus) < 2:
                raise RuntimeError("--pin needs at least 2 usable CPUs")
            self.loadgen_cpus, self.server_cpus = {cpus[0]}, set(cpus[1:])
            os.sched_setaffinity(0, self.loadgen_cpus)
        sim = start_sim(MODEL, a.output_tokens, cpus=self.server_cpus)
        self.procs.append(sim.proc)
        sims = [sim]
        large = None
        if a.body_mib > 0:
            max_len = int(a.body_mib * 1024 * 1024 / 3) + 4096  # ~5.7 chars/token in practice
            extra = ("--max-model-len", str(max_len), "--num-gpu-blocks", str(max_len // 16 + 64))
            large = start_sim(LARGE_MODEL, 16, extra, cpus=self.server_cpus)
            self.procs.append(large.proc)
            sims.append(large)
        for srv in sims:  # they boot in parallel; each reports the port it bound
            srv.wait_ready()
        self.sim_url = sim.url
        models: dict[str, Any] = {MODEL: self._model(MODEL, self.sim_url)}
        if large is not None:
            self.large_sim_url = large.url
            models[LARGE_MODEL] = self._model(LARGE_MODEL, self.large_sim_url)
        cfg = {
            "server": {
                "host": "127.0.0.1",
                "port": 0,  # the gateway binds a free port itself and reports it
                "max_body_bytes": max(64, int(a.body_mib * 2) + 1) * 1024 * 1024,
                "log_level": "info" if a.access_log else "warning",
                "access_log": bool(a.access_log),
            },
            "health": {"enabled": True, "interval_s": 2, "timeout_s": 1},
            "models": models,
        }
        cfg_path = Path(self.tmp.name) / "gateway.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg))
        gw = start_gateway(str(cfg_path), str(self.log_path), cpus=self.server_cpus)
        self.procs.append(gw.proc)
        self.gw_pid = gw.pid
        try:
            self.gw_url = gw.wait_ready("/readyz")
        except RuntimeError as e:
            raise RuntimeError(f"{e}\ngateway log:\n{self.gateway_log()}") from None

    @staticmethod
    def _model(name: str, url: str) -> dict[str, Any]:
        timeouts = {"connect_s": 5, "ttft_s": 60, "stall_s": 30, "total_s": 120}
        return {
            "tiers": {
                "standard": {"served_model_name": name, "endpoints": [url], "timeouts": timeouts}
            }
        }

    def gateway_log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        stop_processes(self.procs)
        self.tmp.cleanup()

    def url(self, target: str, large: bool = False, api: str = "chat") -> str:
        path = APIS[api][0]
        if target == "gateway":
            return self.gw_url + path
        return (self.large_sim_url if large else self.sim_url) + path


async def measure(
    bench: Bench, url: str, body: bytes, stream: bool, conc: int, duration_s: float,
    api: str = "chat",
) -> tuple[Cell, float | None]:
    """One cell at ``url`` (after a warm-up) and the gateway's CPU seconds spent during it."""
    _, _, body_marker, end_marker = APIS[api]
    async with new_session() as session:
        req = aiohttp_request(session, url, body, stream, body_marker=body_marker,
                              end_marker=end_marker)
        await closed_loop(req, conc, bench.args.warmup)
        cpu0 = cpu_seconds(bench.gw_pid)
        cell = await closed_loop(req, conc, duration_s)
        cpu1 = cpu_seconds(bench.gw_pid)
    cpu = cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None
    return cell, cpu


def _agg(cells: list[Cell]) -> dict[str, Any]:
    """Medians over rounds of the per-cell figures, with every run's rps and all errors."""
    sums = [c.summary() for c in cells]
    errors: Counter = Counter()
    for c in cells:
        errors.update(c.errors)
    ttfb = [s["ttfb_p50_ms"] for s in sums if s["ttfb_p50_ms"] is not None]
    return {
        "rps": round(median([c.rps for c in cells]), 1),
        "p50_ms": round(median([s["p50_ms"] for s in sums]), 3),
        "p99_ms": round(median([s["p99_ms"] for s in sums]), 3),
        "ttfb_p50_ms": round(median(ttfb), 3) if ttfb else None,
        "rps_runs": [round(c.rps, 1) for c in cells],
        "ok": sum(c.ok for c in cells),
        "errors": dict(errors),
    }


def _progress(args: argparse.Namespace, text: str) -> None:
    if not args.quiet:
        print(text, file=sys.stderr, flush=True)


def _line(label: str, cell: Cell) -> str:
    s = cell.summary()
    return (
        f"{label} {s['rps']:8.1f} req/s  p50 {s['p50_ms']:7.2f} ms  p99 {s['p99_ms']:7.2f} ms"
        f"  errors {sum(cell.errors.values())}"
    )


async def run_matrix(bench: Bench) -> list[dict[str, Any]]:
    a = bench.args
    cells: dict[tuple[str, str, int, str], list[Cell]] = {}
    gw_cpu: dict[tuple[str, str, int], list[float]] = {}
    for rep in range(a.repeats):
        order = TARGETS if rep % 2 == 0 else TARGETS[::-1]
        for api in a.apis:
            for mode in a.modes:
                stream = mode == "stream"
                body = APIS[api][1](MODEL, stream)
                for conc in a.concurrency:
                    for target in order:
                        cell, cpu = await measure(
                            bench, bench.url(target, api=api), body, stream, conc, a.duration,
                            api,
                        )
                        cells.setdefault((api, mode, conc, target), []).append(cell)
                        if target == "gateway" and cpu is not None and cell.ok:
                            gw_cpu.setdefault((api, mode, conc), []).append(cpu / cell.ok * 1e6)
                        label = f"  round {rep + 1}/{a.repeats} {api:9} {mode:10} c={conc:<3}"
                        _progress(a, _line(f"{label} {target:7}", cell))
    rows = []
    for api in a.apis:
        for mode in a.modes:
            for conc in a.concurrency:
                rows.append(_row(api, mode, conc, cells, gw_cpu))
    return rows


def _row(
    api: str,
    mode: str,
    conc: int,
    cells: dict[tuple[str, str, int, str], list[Cell]],
    gw_cpu: dict[tuple[str, str, int], list[float]],
) -> dict[str, Any]:
    d = _agg(cells[(api, mode, conc, "direct")])
    g = _agg(cells[(api, mode, conc, "gateway")])
    cpu_us = gw_cpu.get((api, mode, conc))
    chat_cpu = gw_cpu.get(("chat", mode, conc))
    cpu_vs_chat = (
        round(median(cpu_us) / median(chat_cpu), 3) if cpu_us and chat_cpu else None
    )
    return {
        "api": api,
        "mode": mode,
        "concurrency": conc,
        "direct": d,
        "gateway": g,
        "rps_ratio_gateway_over_direct": round(g["rps"] / d["rps"], 3) if d["rps"] else None,
        "added_p50_ms": round(g["p50_ms"] - d["p50_ms"], 3),
        "added_p99_ms": round(g["p99_ms"] - d["p99_ms"], 3),
        "gateway_cpu_us_per_request": round(median(cpu_us), 1) if cpu_us else None,
        "gateway_cpu_vs_chat": cpu_vs_chat,
    }


async def run_large(bench: Bench) -> dict[str, Any]:
    """Large-body forwarding alone, then the small-request stall check."""
    a = bench.args
    large_body = long_chat_body(LARGE_MODEL, a.body_mib)
    small_body = chat_body(MODEL, False)
    fwd: dict[str, list[Cell]] = {t: [] for t in TARGETS}
    stall: dict[tuple[str, str], list[Cell]] = {}
    bg_cells: dict[str, list[Cell]] = {t: [] for t in TARGETS}
    for rep in range(a.repeats):
        order = TARGETS if rep % 2 == 0 else TARGETS[::-1]
        for target in order:
            cell, _ = await measure(
                bench,
                bench.url(target, large=True),
                large_body,
                False,
                a.large_concurrency,
                a.large_duration,
            )
            fwd[target].append(cell)
            _progress(a, _line(f"  round {rep + 1}/{a.repeats} large alone      {target:7}", cell))
        for target in order:
            # without: small requests alone
            async with new_session() as s_small:
                small = aiohttp_request(s_small, bench.url(target), small_body, False)
                await closed_loop(small, a.stall_concurrency, a.warmup)
                alone = await closed_loop(small, a.stall_concurrency, a.duration)
                stall.setdefault((target, "alone"), []).append(alone)
                _progress(
                    a, _line(f"  round {rep + 1}/{a.repeats} small alone      {target:7}", alone)
                )
                # with: the same small load while large requests are in flight
                async with new_session() as s_large:
                    large = aiohttp_request(
                        s_large, bench.url(target, large=True), large_body, False
                    )
                    bg = asyncio.create_task(
                        closed_loop(large, a.large_concurrency, a.duration + 0.5)
                    )
                    await asyncio.sleep(0.3)  # the large requests are in flight first
                    with_large = await closed_loop(small, a.stall_concurrency, a.duration)
                    bg_cell = await bg
                stall.setdefault((target, "with_large"), []).append(with_large)
                bg_cells[target].append(bg_cell)
                _progress(
                    a,
                    _line(f"  round {rep + 1}/{a.repeats} small with large {target:7}", with_large),
                )
    body_mib = len(large_body) / 1024 / 1024
    forwarding = {t: _agg(fwd[t]) for t in TARGETS}
    for t in TARGETS:
        forwarding[t]["mib_per_s"] = round(forwarding[t]["rps"] * body_mib, 1)
    d, g = forwarding["direct"], forwarding["gateway"]
    return {
        "body_mib": round(body_mib, 2),
        "large_concurrency": a.large_concurrency,
        "stall_concurrency": a.stall_concurrency,
        "forwarding": forwarding,
        "forwarding_added_p50_ms": round(g["p50_ms"] - d["p50_ms"], 3),
        "stall": {
            t: {
                "small_alone": _agg(stall[(t, "alone")]),
                "small_with_large": _agg(stall[(t, "with_large")]),
                "large_in_background": _agg(bg_cells[t]),
            }
            for t in TARGETS
        },
    }


LOG_PROBLEM = re.compile(r"\b(WARNING|ERROR|CRITICAL)\b|Traceback")


def scan_log(text: str) -> list[str]:
    """Lines of the gateway log that are warnings, errors or tracebacks."""
    return [ln for ln in text.splitlines() if LOG_PROBLEM.search(ln)]


def print_report(result: dict[str, Any]) -> None:
    s = result["settings"]
    print(
        f"\nGateway overhead: zero-delay simulator ({s['output_tokens']} output tokens), "
        f"{s['duration_s']} s per cell, median of {s['repeats']} interleaved rounds; "
        f"pin={s['pin']} access_log={s['access_log']} cpus={s['cpus']} Python {s['python']}"
    )
    head = (
        f"{'api':9} {'mode':10} {'conc':>4} | {'direct rps':>10} {'gw rps':>8} {'ratio':>5} | "
        f"{'p50 d':>7} {'p50 gw':>7} {'+p50':>6} | {'p99 d':>7} {'p99 gw':>7} | "
        f"{'ttfb d':>6} {'ttfb gw':>7} | {'gw cpu/req':>10} {'vs chat':>7} | err d/gw"
    )
    print(head)
    print("-" * len(head))
    for r in result["rows"]:
        d, g = r["direct"], r["gateway"]
        ttfb_d = f"{d['ttfb_p50_ms']:6.2f}" if d["ttfb_p50_ms"] is not None else f"{'-':>6}"
        ttfb_g = f"{g['ttfb_p50_ms']:7.2f}" if g["ttfb_p50_ms"] is not None else f"{'-':>7}"
        cpu = r["gateway_cpu_us_per_request"]
        cpu_s = f"{cpu:8.0f}us" if cpu is not None else f"{'-':>10}"
        ratio = r["rps_ratio_gateway_over_direct"]
        vs = r["gateway_cpu_vs_chat"]
        vs_s = f"{vs:7.2f}" if vs is not None and r["api"] != "chat" else f"{'-':>7}"
        print(
            f"{r['api']:9} {r['mode']:10} {r['concurrency']:>4} | {d['rps']:>10.1f} "
            f"{g['rps']:>8.1f} "
            f"{ratio if ratio is not None else float('nan'):>5.2f} | "
            f"{d['p50_ms']:>7.2f} {g['p50_ms']:>7.2f} {r['added_p50_ms']:>+6.2f} | "
            f"{d['p99_ms']:>7.2f} {g['p99_ms']:>7.2f} | {ttfb_d} {ttfb_g} | {cpu_s} {vs_s} | "
            f"{sum(d['errors'].values())}/{sum(g['errors'].values())}"
        )
    print(
        "latencies in ms (p50/p99: medians over rounds of per-cell percentiles); ratio = gateway"
        " rps / direct rps; +p50 = gateway p50 - direct p50; ttfb = time to first body byte p50;"
        " gw cpu/req = gateway process CPU time per request"
    )
    lg = result.get("large")
    if lg:
        f = lg["forwarding"]
        print(
            f"\nLarge bodies: {lg['body_mib']} MiB chat requests (separate simulator), "
            f"{lg['large_concurrency']} concurrent"
        )
        print(f"{'target':8} | {'rps':>6} {'MiB/s':>7} | {'p50 ms':>8} {'p99 ms':>8} | errors")
        for t in TARGETS:
            x = f[t]
            print(
                f"{t:8} | {x['rps']:>6.1f} {x['mib_per_s']:>7.1f} | {x['p50_ms']:>8.1f} "
                f"{x['p99_ms']:>8.1f} | {sum(x['errors'].values())}"
            )
        print(f"gateway adds {lg['forwarding_added_p50_ms']:+.1f} ms p50 per large request")
        print(
            f"\nStall check: small non-stream requests ({lg['stall_concurrency']} concurrent) "
            f"without / with {lg['large_concurrency']} large requests in flight"
        )
        print(
            f"{'target':8} | {'small p50':>9} {'p99':>8} {'rps':>7} | {'+large p50':>10} "
            f"{'p99':>8} {'rps':>7} | {'large rps':>9} | errors small/large"
        )
        for t in TARGETS:
            st = lg["stall"][t]
            a, w, b = st["small_alone"], st["small_with_large"], st["large_in_background"]
            errs = sum(a["errors"].values()) + sum(w["errors"].values())
            print(
                f"{t:8} | {a['p50_ms']:>9.2f} {a['p99_ms']:>8.2f} {a['rps']:>7.1f} | "
                f"{w['p50_ms']:>10.2f} {w['p99_ms']:>8.2f} {w['rps']:>7.1f} | {b['rps']:>9.1f} | "
                f"{errs}/{sum(b['errors'].values())}"
            )
    errs = result["errors"]
    if errs:
        print("\nERRORS (target/mode/concurrency: kind -> count):")
        for where, kinds in errs.items():
            print(f"  {where}: {kinds}")
    else:
        print("\nno request errors")
    problems = result["gateway_log_problems"]
    print(f"gateway log: {len(problems)} warning/error/traceback line(s)")
    for ln in problems[:20]:
        print(f"  {ln}")


def collect_errors(result: dict[str, Any]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for r in result["rows"]:
        for t in TARGETS:
            if r[t]["errors"]:
                out[f"{t}/{r['api']}/{r['mode']}/c={r['concurrency']}"] = r[t]["errors"]
    lg = result.get("large")
    if lg:
        for t in TARGETS:
            if lg["forwarding"][t]["errors"]:
                out[f"{t}/large-alone"] = lg["forwarding"][t]["errors"]
            for k, v in lg["stall"][t].items():
                if v["errors"]:
                    out[f"{t}/stall/{k}"] = v["errors"]
    return out


async def run_all(bench: Bench) -> dict[str, Any]:
    a = bench.args
    result: dict[str, Any] = {
        "benchmark": "overhead",
        "settings": {
            "duration_s": a.duration,
            "warmup_s": a.warmup,
            "repeats": a.repeats,
            "concurrency": a.concurrency,
            "apis": a.apis,
            "modes": a.modes,
            "output_tokens": a.output_tokens,
            "body_mib": a.body_mib,
            "pin": bool(a.pin),
            "access_log": bool(a.access_log),
            "cpus": os.cpu_count(),
            "loadgen_cpus": sorted(bench.loadgen_cpus or []),
            "server_cpus": sorted(bench.server_cpus or []),
            "python": platform.python_version(),
        },
        "rows": await run_matrix(bench),
    }
    if a.body_mib > 0:
        result["large"] = await run_large(bench)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=2.5, help="seconds per cell (default 2.5)")
    p.add_argument("--warmup", type=float, default=0.3, help="warm-up seconds per cell")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    p.add_argument("--apis", nargs="+", choices=list(APIS), default=list(APIS),
                   help="client APIs to measure (default: chat responses messages)")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES),
                   help="non-stream and/or stream (default both)")
    p.add_argument("--output-tokens", type=int, default=64, help="completion length (tokens)")
    p.add_argument(
        "--body-mib",
        type=float,
        default=5.0,
        help="large-body size in MiB for the forwarding and stall checks; 0 skips",
    )
    p.add_argument(
        "--large-concurrency",
        type=int,
        default=2,
        help="large requests in flight at once (default 2)",
    )
    p.add_argument(
        "--large-duration",
        type=float,
        default=3.0,
        help="seconds per large-forwarding cell (default 3)",
    )
    p.add_argument(
        "--stall-concurrency",
        type=int,
        default=8,
        help="concurrent small requests in the stall check (default 8)",
    )
    p.add_argument(
        "--access-log",
        action="store_true",
        help="gateway at log level info with its access log (default: warning, off)",
    )
    p.add_argument(
        "--pin",
        action="store_true",
        help="pin the load generator to one core and the servers to the others",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    p.add_argument("--quiet", action="store_true", help="no per-cell progress on stderr")
    args = p.parse_args(argv)

    install_loop()
    raise_on_sigterm()
    bench = Bench(args)
    try:
        bench.start()
        result = asyncio.run(run_all(bench))
        result["gateway_log_problems"] = scan_log(bench.gateway_log())
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        bench.stop()
    result["errors"] = collect_errors(result)
    if args.json:
        print(json.dumps(result))
    else:
        print_report(result)
    return 1 if result["errors"] or result["gateway_log_problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
