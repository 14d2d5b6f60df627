"""The figures ``loadtests/bench_capacity_core.py`` derives from its cells, and its table.

Per target and kind (``non-stream``, ``stream``): ``max_rps``; ``rps_at_p99_le_{1,5,10}ms``
(the best cell whose p99 meets the bound; None when none does); ``c1_p50_ms``/``c1_p99_ms``
and, against ``direct``, ``added_c1_p50_ms``/``added_c1_p99_ms``; ``tail`` (p99/p50 per
concurrency); ``cpu_us_per_request`` (the target's CPU over its cells at c ≥ ``SATURATED_C``
divided by their requests) and ``rps_per_core`` (1e6 / that: the capacity of one fully used
core, which machine noise distorts far less than a req/s reading); for streams
``cpu_us_per_event`` (per request / ``chunks + 1`` events) and ``cpu_us_per_extra_event``
(stream minus non-stream, per chunk); ``gc_*`` from the gateway's
``speedgate_process_gc_*`` metrics.
"""

from __future__ import annotations

import statistics
from typing import Any

KINDS = ("non-stream", "stream")
P99_BOUNDS_MS = (1, 5, 10)
SATURATED_C = 32  # CPU per request is read from the cells at this concurrency and above


def merge_rounds(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (kind, concurrency, target) from several rounds: the median round's req/s,
    p50 and p99 (each its own median), requests and CPU seconds summed, GC deltas summed."""
    groups: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["kind"], r["concurrency"], r["target"]), []).append(r)
    out = []
    for (kind, conc, target), rs in groups.items():
        cpus = [r["cpu_s"] for r in rs if r["cpu_s"] is not None]
        gcs = [r["gc"] for r in rs if r.get("gc")]
        out.append({
            "kind": kind, "concurrency": conc, "target": target,
            "rps": round(statistics.median(r["rps"] for r in rs), 1),
            "p50_ms": round(statistics.median(r["p50_ms"] for r in rs), 3),
            "p99_ms": round(statistics.median(r["p99_ms"] for r in rs), 3),
            "ok": sum(r["ok"] for r in rs),
            "cpu_s": sum(cpus) if len(cpus) == len(rs) else None,
            "gc": {"collections": {g: sum(x["collections"][g] for x in gcs) for g in "012"},
                   "pause_ms": sum(x["pause_ms"] for x in gcs),
                   "collected": sum(x["collected"] for x in gcs),
                   "max_pause_ms": max(x["max_pause_ms"] for x in gcs)} if gcs else None,
        })  # fmt: skip
    return out


def summarize(rows: list[dict[str, Any]], chunks: int) -> dict[str, dict[str, Any]]:
    """Per target and kind: the derived figures of the module docstring."""
    out: dict[str, dict[str, Any]] = {}
    by = {(r["kind"], r["concurrency"], r["target"]): r for r in rows}
    for r in rows:
        out.setdefault(r["target"], {}).setdefault(r["kind"], {})
    for target, kinds in out.items():
        for kind, s in kinds.items():
            cells = [r for r in rows if r["target"] == target and r["kind"] == kind and r["ok"]]
            s["max_rps"] = max((r["rps"] for r in cells), default=0.0)
            for bound in P99_BOUNDS_MS:
                fit = [r["rps"] for r in cells if r["p99_ms"] <= bound]
                s[f"rps_at_p99_le_{bound}ms"] = max(fit) if fit else None
            s["tail"] = {r["concurrency"]: round(r["p99_ms"] / r["p50_ms"], 2)
                         for r in cells if r["p50_ms"] > 0}
            c1, d1 = by.get((kind, 1, target)), by.get((kind, 1, "direct"))
            if c1 is not None:
                s["c1_p50_ms"], s["c1_p99_ms"] = c1["p50_ms"], c1["p99_ms"]
                if d1 is not None and target != "direct":
                    s["added_c1_p50_ms"] = round(c1["p50_ms"] - d1["p50_ms"], 3)
                    s["added_c1_p99_ms"] = round(c1["p99_ms"] - d1["p99_ms"], 3)
            hot = [r for r in cells if r["concurrency"] >= SATURATED_C and r["cpu_s"] is not None]
            ok = sum(r["ok"] for r in hot)
            if ok:
                per_req = sum(r["cpu_s"] for r in hot) / ok * 1e6
                s["cpu_us_per_request"] = round(per_req, 1)
                s["rps_per_core"] = round(1e6 / per_req)
                if kind == "stream":
                    s["cpu_us_per_event"] = round(per_req / (chunks + 1), 2)
            gcs = [r["gc"] for r in cells if r.get("gc")]
            if gcs:
                s["gc_collections"] = {g: sum(x["collections"][g] for x in gcs) for g in "012"}
                s["gc_pause_ms"] = round(sum(x["pause_ms"] for x in gcs), 2)
                s["gc_collected_per_request"] = round(
                    sum(x["collected"] for x in gcs) / max(1, sum(r["ok"] for r in cells)), 2)
                s["gc_max_pause_ms"] = max(x["max_pause_ms"] for x in gcs)
        st, ns = kinds.get("stream", {}), kinds.get("non-stream", {})
        if "cpu_us_per_request" in st and "cpu_us_per_request" in ns:
            st["cpu_us_per_extra_event"] = round(
                (st["cpu_us_per_request"] - ns["cpu_us_per_request"]) / chunks, 2)
    return out


def _f(v: Any) -> str:
    if v is None:
        return "—"
    return f"{v:,.0f}" if isinstance(v, float) and v >= 100 else str(v)


def print_report(res: dict[str, Any]) -> None:
    s, targets = res["summary"], res["settings"]["targets"]
    print(f"load average {res['settings']['loadavg']}; gateway cpus "
          f"{res['settings']['server_cpus']}, engine + load generator "
          f"{res['settings']['loadgen_cpus']}")
    print("| | " + " | ".join(targets) + " |")
    print("|---" * (len(targets) + 1) + "|")
    keys = ["max_rps", *(f"rps_at_p99_le_{b}ms" for b in P99_BOUNDS_MS), "c1_p50_ms",
            "c1_p99_ms", "added_c1_p50_ms", "added_c1_p99_ms", "tail", "cpu_us_per_request",
            "rps_per_core",
            "cpu_us_per_event", "cpu_us_per_extra_event", "gc_collections", "gc_pause_ms",
            "gc_max_pause_ms", "gc_collected_per_request"]
    for kind in KINDS:
        for k in keys:
            vals = [s.get(t, {}).get(kind, {}).get(k) for t in targets]
            if any(v is not None for v in vals):
                print(f"| {kind} {k} | " + " | ".join(_f(v) for v in vals) + " |")
    for k in ("start_kib", "per_stream_kib"):
        print(f"| rss {k} | " + " | ".join(_f(res["rss"].get(t, {}).get(k)) for t in targets)
              + " |")
    if res["errors"]:
        print("errors:", res["errors"])


