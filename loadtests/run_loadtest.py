"""Headless locust run with a report folder: CSVs, summary (Markdown + JSON) and PNG plots.

Method: with ``--start-stack`` (the default when no ``--host`` is given) starts the CPU stack:
``--replicas`` engine simulators per tier (``python -m engines.sim``, the fast pool in
speculative mode, ``--time-scale``, a 1M-token context so long agent sessions fit) and a
gateway process (``python -m gateway serve``, one model ``mymodel`` with tiers standard and fast,
aliases, fallback fast -> standard; log level warning, no access log unless ``--access-log``).
Then runs ``locust --headless`` on ``loadtests/locustfile.py`` for ``--run-time`` seconds with
``--users`` users spawned at ``--spawn-rate``/s (user classes ``--classes``), writing locust's
CSVs (``locust_stats.csv``, ``locust_stats_history.csv``, ``locust_failures.csv``...), its HTML
report and ``samples.jsonl`` (one line per request, from the locustfile). From the samples it
draws:

- ``ttft.png``, ``itl.png``: TTFT and inter-token latency distributions (CDF) per served tier;
- ``throughput.png``: completed requests/s and output tokens/s over time, per tier;
- ``errors.png``: error rate (%) over time;
- ``cache_hit_by_turn.png``: prefix-cache hit rate (cached / prompt tokens, from the engine's
  ``usage``) by agent-session turn, sessions with and without ``x-session-id`` apart;

and writes ``summary.md`` (settings, per-tier table, cache hit by turn, failures, file list) and
``summary.json`` (the same figures). Every process started is stopped at the end, on Ctrl-C and
on SIGTERM. Exit status: locust's (1 when any request failed), 2 when the run itself failed.

Run::

    .venv/bin/python -m loadtests.run_loadtest                       # CPU stack, 60 s, 20 users
    .venv/bin/python -m loadtests.run_loadtest --users 50 --run-time 120 --classes AgentSessionUser
    .venv/bin/python -m loadtests.run_loadtest --host http://10.0.0.5:8080 --api-key sk-... \\
        --model mymodel --tier-via none            # any OpenAI-compatible server, no stack
    make loadtest ARGS="--users 40 --run-time 90"

Arguments after ``--`` go to locust (and to the locustfile: ``--think-time 0.5-2``,
``--min-turns 5``, ``--session-header-ratio 1``...).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

from engines.sim.spawn import spawn_simulator
from loadtests._common import (
    pct,
    raise_on_sigterm,
    start_gateway,
    stop_processes,
)

HERE = Path(__file__).resolve().parent
LOCUSTFILE = HERE / "locustfile.py"
MODEL = "mymodel"
SIM_ARGS = ("--max-model-len", "1048576", "--num-gpu-blocks", "70000")


class CpuStack:
    """Simulators per tier and a gateway process, on localhost ports each binds itself."""

    def __init__(self, replicas: int, time_scale: float, access_log: bool, workdir: Path) -> None:
        self.replicas, self.time_scale, self.access_log = replicas, time_scale, access_log
        self.workdir = workdir
        self.procs: list[subprocess.Popen] = []
        self.sims: dict[str, list[str]] = {"standard": [], "fast": []}
        self.url = ""
        self.log_path = workdir / "gateway.log"

    def start(self) -> str:
        seed = 0
        waits = []
        for tier, mode in (("standard", "standard"), ("fast", "speculative")):
            for _ in range(self.replicas):
                sim = spawn_simulator(mode, self.time_scale, seed, SIM_ARGS, model=MODEL)
                self.procs.append(sim.proc)
                waits.append((tier, sim))
                seed += 1
        for tier, sim in waits:  # they boot in parallel; each reports the port it bound
            self.sims[tier].append(sim.wait_ready())
        timeouts = {"connect_s": 2, "ttft_s": 60, "stall_s": 30, "total_s": 600}
        cfg = {
            "server": {
                "host": "127.0.0.1",
                "port": 0,  # the gateway binds a free port itself and reports it
                "log_level": "info" if self.access_log else "warning",
                "access_log": self.access_log,
            },
            "health": {"interval_s": 2, "timeout_s": 1},
            "models": {
                MODEL: {
                    "aliases": {f"{MODEL}-fast": "fast", f"{MODEL}-standard": "standard",
                                f"{MODEL}-auto": "auto"},
                    "fallback": {"fast": "standard"},
                    "tiers": {
                        tier: {"served_model_name": MODEL, "endpoints": urls,
                               "timeouts": timeouts}
                        for tier, urls in self.sims.items()
                    },
                }
            },
        }
        cfg_path = self.workdir / "gateway.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg))
        gw = start_gateway(str(cfg_path), str(self.log_path))
        self.procs.append(gw.proc)
        try:
            self.url = gw.wait_ready("/readyz")
        except RuntimeError as e:
            raise RuntimeError(f"{e}\ngateway log:\n{self.log()}") from None
        return self.url

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        stop_processes(self.procs)


def run_locust(args: argparse.Namespace, host: str, out: Path, extra: list[str]) -> int:
    """locust --headless into ``out``; returns its exit status."""
    cmd = [
        sys.executable, "-m", "locust",
        "-f", str(LOCUSTFILE),
        "--headless",
        "--host", host,
        "-u", str(args.users),
        "-r", str(args.spawn_rate),
        "-t", f"{args.run_time}s",
        "--stop-timeout", str(args.stop_timeout),
        "--csv", str(out / "locust"),
        "--csv-full-history",
        "--html", str(out / "locust.html"),
        "--only-summary",
        "--loglevel", "WARNING",
        "--api-key", args.api_key,
        "--model", args.model,
        "--tier-mix", args.tier_mix,
        "--tier-via", args.tier_via,
        "--samples-file", str(out / "samples.jsonl"),
        *extra,
        *args.classes,
    ]  # fmt: skip
    (out / "locust_command.txt").write_text(" ".join(cmd) + "\n")
    with open(out / "locust_output.txt", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return proc.wait(timeout=args.run_time + args.stop_timeout + 60)
        finally:
            stop_processes([proc])


# -- report -----------------------------------------------------------------------------------
def load_samples(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            out.append(json.loads(line))
    return out


def _ms(v: float) -> float:
    return round(v * 1e3, 2) if v == v else float("nan")


def summarize(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Per served tier: counts, TTFT/ITL/e2e percentiles (ms), output tok/s; cache hit by turn."""
    by_tier: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s in samples:
        by_tier[s.get("tier") or s.get("tier_req") or "?"].append(s)
    tiers: dict[str, Any] = {}
    for tier, rows in sorted(by_tier.items()):
        ok = [r for r in rows if r.get("ok")]
        ttft = [r["ttft"] for r in ok if r.get("ttft") is not None]
        itl = [g for r in ok for g in r.get("itl") or ()]
        e2e = [r["e2e"] for r in ok]
        tps = [
            (r["out_tokens"] - 1) / (r["e2e"] - r["ttft"])
            for r in ok
            if r.get("ttft") is not None and r.get("out_tokens", 0) > 1 and r["e2e"] > r["ttft"]
        ]
        tiers[tier] = {
            "requests": len(rows),
            "errors": len(rows) - len(ok),
            "ttft_ms": {q: _ms(pct(ttft, v)) for q, v in (("p50", .5), ("p90", .9), ("p99", .99))},
            "itl_ms": {q: _ms(pct(itl, v)) for q, v in (("p50", .5), ("p90", .9), ("p99", .99))},
            "e2e_ms": {q: _ms(pct(e2e, v)) for q, v in (("p50", .5), ("p99", .99))},
            "tok_s_p50": round(pct(tps, 0.5), 1) if tps else None,
            "output_tokens": sum(r.get("out_tokens") or 0 for r in ok),
            "ttft_samples": len(ttft),
            "itl_samples": len(itl),
        }
    return {"tiers": tiers, "cache_by_turn": cache_by_turn(samples)}


def cache_by_turn(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Agent turns: cached / prompt tokens summed per turn, with and without x-session-id."""
    acc: dict[tuple[int, bool], list[int]] = defaultdict(lambda: [0, 0, 0])
    for s in samples:
        if s.get("user") != "agent" or not s.get("ok") or not s.get("prompt_tokens"):
            continue
        if s.get("cached_tokens") is None:
            continue
        a = acc[(int(s["turn"]), bool(s.get("session_header")))]
        a[0] += s["cached_tokens"]
        a[1] += s["prompt_tokens"]
        a[2] += 1
    return [
        {"turn": t, "session_header": h, "requests": n, "hit_rate": round(c / p, 4) if p else None}
        for (t, h), (c, p, n) in sorted(acc.items())
    ]


def plot_all(samples: list[dict[str, Any]], out: Path) -> list[str]:
    """Draw the PNGs; returns their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    ok = [s for s in samples if s.get("ok")]
    tiers = sorted({s.get("tier") or "?" for s in ok})

    def cdf(key: str, title: str, fname: str, flatten: bool) -> None:
        fig, ax = plt.subplots(figsize=(7, 4))
        for tier in tiers:
            vals: list[float] = []
            for s in ok:
                if (s.get("tier") or "?") != tier:
                    continue
                v = s.get(key)
                if flatten:
                    vals.extend(v or ())
                elif v is not None:
                    vals.append(v)
            if not vals:
                continue
            vals = sorted(x * 1e3 for x in vals)
            ys = [(i + 1) / len(vals) for i in range(len(vals))]
            ax.plot(vals, ys, label=f"{tier} (n={len(vals)}, p50 {vals[len(vals) // 2]:.1f} ms)")
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of samples ≤ x")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / fname, dpi=100)
        plt.close(fig)
        files.append(fname)

    cdf("ttft", "Time to first token per served tier (CDF)", "ttft.png", False)
    cdf("itl", "Inter-token latency per served tier (CDF)", "itl.png", True)

    if samples:
        t0 = min(s["t"] for s in samples)
        end = {id(s): s["t"] + (s.get("e2e") or 0) - t0 for s in samples}
        span = max(1, math.ceil(max(end.values())))
        fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
        for tier in tiers:
            rps = [0] * span
            tps = [0] * span
            for s in ok:
                if (s.get("tier") or "?") == tier:
                    b = min(span - 1, int(end[id(s)]))
                    rps[b] += 1
                    tps[b] += s.get("out_tokens") or 0
            ax1.plot(range(span), rps, label=tier)
            ax2.plot(range(span), tps, label=tier)
        ax1.set_ylabel("completed requests/s")
        ax2.set_ylabel("output tokens/s")
        ax2.set_xlabel("seconds since start")
        ax1.set_title("Throughput over time per served tier")
        for ax in (ax1, ax2):
            ax.grid(alpha=0.3)
            ax.legend()
        fig.tight_layout()
        fig.savefig(out / "throughput.png", dpi=100)
        plt.close(fig)
        files.append("throughput.png")

        total = [0] * span
        bad = [0] * span
        for s in samples:
            b = min(span - 1, int(end[id(s)]))
            total[b] += 1
            bad[b] += 0 if s.get("ok") else 1
        fig, ax = plt.subplots(figsize=(7, 3.5))
        ax.plot(range(span), [100 * b / t if t else 0 for b, t in zip(bad, total, strict=True)])
        ax.set_ylim(bottom=0)
        ax.set_xlabel("seconds since start")
        ax.set_ylabel("errors, % of requests")
        ax.set_title(f"Error rate over time ({sum(bad)} of {sum(total)} requests failed)")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / "errors.png", dpi=100)
        plt.close(fig)
        files.append("errors.png")

    turns = cache_by_turn(samples)
    fig, ax = plt.subplots(figsize=(7, 4))
    for header in (True, False):
        pts = [(r["turn"], r["hit_rate"] * 100) for r in turns
               if r["session_header"] is header and r["hit_rate"] is not None]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", ms=3,
                    label="with x-session-id" if header else "without x-session-id")
    ax.set_xlabel("agent session turn")
    ax.set_ylabel("prefix-cache hit rate, % of prompt tokens")
    ax.set_ylim(0, 100)
    ax.set_title("Cache hit rate over session turns")
    ax.grid(alpha=0.3)
    if turns:
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no agent turns with cached-token usage", ha="center",
                transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(out / "cache_hit_by_turn.png", dpi=100)
    plt.close(fig)
    files.append("cache_hit_by_turn.png")
    return files


def write_summary(out: Path, settings: dict[str, Any], summary: dict[str, Any],
                  files: list[str], locust_rc: int) -> None:
    (out / "summary.json").write_text(json.dumps(
        {"settings": settings, "locust_exit_status": locust_rc, **summary}, indent=1))
    lines = [
        "# Load test report",
        "",
        f"- target: `{settings['host']}` ({'CPU stack started by the runner' if settings['stack'] else 'external'})",  # noqa: E501
        f"- users: {settings['users']} ({', '.join(settings['classes'])}), spawn rate "
        f"{settings['spawn_rate']}/s, run time {settings['run_time']} s, tier mix "
        f"`{settings['tier_mix']}` via {settings['tier_via']}",
        f"- simulator time scale: {settings.get('time_scale')}; locust exit status {locust_rc}",
        f"- started {settings['started']}",
        "",
        "## Per served tier (streamed requests; ms unless noted)",
        "",
        "| tier | requests | errors | TTFT p50 | p90 | p99 | ITL p50 | p90 | p99 | e2e p50 | p99 "
        "| out tok/s p50 | output tokens |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for tier, t in summary["tiers"].items():
        lines.append(
            f"| {tier} | {t['requests']} | {t['errors']} | {t['ttft_ms']['p50']} | "
            f"{t['ttft_ms']['p90']} | {t['ttft_ms']['p99']} | {t['itl_ms']['p50']} | "
            f"{t['itl_ms']['p90']} | {t['itl_ms']['p99']} | {t['e2e_ms']['p50']} | "
            f"{t['e2e_ms']['p99']} | {t['tok_s_p50']} | {t['output_tokens']} |"
        )
    turns = summary["cache_by_turn"]
    lines += ["", "## Prefix-cache hit rate by agent turn", ""]
    if turns:
        lines += ["| turn | x-session-id | requests | hit rate |", "|---|---|---|---|"]
        lines += [
            f"| {r['turn']} | {'yes' if r['session_header'] else 'no'} | {r['requests']} | "
            f"{'' if r['hit_rate'] is None else format(r['hit_rate'] * 100, '.1f') + ' %'} |"
            for r in turns
        ]
    else:
        lines.append("(no agent turns with cached-token usage)")
    failures = out / "locust_failures.csv"
    if failures.exists() and len(failures.read_text().splitlines()) > 1:
        lines += ["", "## Failures (locust_failures.csv)", "", "```",
                  *failures.read_text().splitlines()[:30], "```"]
    lines += ["", "## Plots", ""] + [f"![{f}]({f})" for f in files]
    lines += ["", "## Files", ""] + [f"- `{p.name}`" for p in sorted(out.iterdir())]
    (out / "summary.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="", help="target base URL; empty: start the CPU stack")
    p.add_argument("--start-stack", action="store_true", help="start simulators + gateway")
    p.add_argument("--users", type=int, default=20)
    p.add_argument("--spawn-rate", type=float, default=5)
    p.add_argument("--run-time", type=int, default=60, help="seconds")
    p.add_argument("--stop-timeout", type=int, default=10,
                   help="seconds given to requests in flight at the end")
    p.add_argument("--classes", nargs="+", default=["ChatUser", "AgentSessionUser"])
    p.add_argument("--tier-mix", default="standard=1,fast=1,auto=1")
    p.add_argument("--tier-via", default="header", choices=["header", "service_tier", "none"])
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "unused"))
    p.add_argument("--model", default=MODEL)
    p.add_argument("--replicas", type=int, default=1, help="simulators per tier (stack)")
    p.add_argument("--time-scale", type=float, default=1.0, help="simulator time scale (stack)")
    p.add_argument("--access-log", action="store_true", help="gateway access log on (stack)")
    p.add_argument("--report-dir", default="", help="default reports/loadtest-<time>")
    args = p.parse_args(argv)

    start_stack = args.start_stack or not args.host
    out = Path(args.report_dir or f"reports/loadtest-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    for old in ("samples.jsonl",):  # appended by the locustfile: start clean
        (out / old).unlink(missing_ok=True)
    raise_on_sigterm()
    stack: CpuStack | None = None
    tmp = tempfile.TemporaryDirectory(prefix="speedgate-loadtest-")
    settings = {
        "host": args.host, "stack": start_stack, "users": args.users,
        "spawn_rate": args.spawn_rate, "run_time": args.run_time, "classes": args.classes,
        "tier_mix": args.tier_mix, "tier_via": args.tier_via, "model": args.model,
        "time_scale": args.time_scale if start_stack else None, "locust_extra": extra,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    try:
        if start_stack:
            stack = CpuStack(args.replicas, args.time_scale, args.access_log, Path(tmp.name))
            settings["host"] = stack.start()
            settings["simulators"] = stack.sims
            print(f"stack up: gateway {settings['host']}, simulators {stack.sims}", flush=True)
        print(f"locust: {args.users} users for {args.run_time} s -> {out}", flush=True)
        rc = run_locust(args, settings["host"], out, extra)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"run_loadtest: {e}", file=sys.stderr)
        return 2
    finally:
        if stack is not None:
            log = stack.log()
            stack.stop()
            (out / "gateway.log").write_text(log)
        tmp.cleanup()
    samples = load_samples(out / "samples.jsonl")
    summary = summarize(samples)
    files = plot_all(samples, out)
    write_summary(out, settings, summary, files, rc)
    print((out / "summary.md").read_text())
    print(f"report: {out.resolve()}/summary.md (locust exit status {rc})")
    return rc


if __name__ == "__main__":
    sys.exit(main())
