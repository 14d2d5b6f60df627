"""Upstream HTTP client candidates side by side: aiohttp vs httpx against one engine.

Method: one zero-delay engine simulator (``python -m engines.sim --time-scale 0``) is started
as a subprocess; this process (uvloop, like the gateway) drives it with the same closed load
loop for each client: ``N`` concurrent workers, each sending chat requests back to back for
``--duration`` seconds after a short warm-up that opens the connections. Clients:

- aiohttp: one ``ClientSession``, ``TCPConnector(limit=0)`` (the gateway's setup);
- httpx: one ``AsyncClient``, HTTP/1.1, ``Limits`` sized to the concurrency.

Each (mode, concurrency, client) cell is run ``--repeats`` times, interleaved (the client order
alternates between rounds) so that the machine's noise hits both; the table shows the median
over repeats of requests/s and of the per-cell p50/p99 latency, and aiohttp/httpx ratios
(rps ratio > 1: aiohttp faster; latency ratio < 1: aiohttp faster). Non-streaming reads the
whole JSON body; streaming reads the whole SSE stream and checks it ends with ``[DONE]``.
Errors (non-200, exceptions, truncated streams) are counted and printed, never dropped.

Run (defaults take about 2.5 minutes)::

    .venv/bin/python -m loadtests.bench_http_clients
    .venv/bin/python -m loadtests.bench_http_clients --duration 2 --concurrency 16 64 --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import time
from collections import Counter
from typing import Any

import aiohttp
import httpcore
import httpx

from loadtests._common import (
    JSON_HEADERS,
    Cell,
    RequestFn,
    aiohttp_request,
    chat_body,
    closed_loop,
    install_loop,
    median,
    new_session,
    raise_on_sigterm,
    start_sim,
    stop_processes,
)

MODEL = "bench"
CLIENTS = ("aiohttp", "httpx")
MODES = ("non-stream", "stream")


def httpx_request(client: httpx.AsyncClient, url: str, body: bytes, stream: bool) -> RequestFn:
    """The httpx twin of ``aiohttp_request`` (same checks)."""

    async def one() -> tuple[float, float | None] | str:
        t0 = time.perf_counter()
        if not stream:
            r = await client.post(url, content=body, headers=JSON_HEADERS)
            if r.status_code != 200:
                return f"http {r.status_code}"
            if b'"choices"' not in r.content:
                return "bad body"
            return time.perf_counter() - t0, None
        async with client.stream("POST", url, content=body, headers=JSON_HEADERS) as r:
            if r.status_code != 200:
                await r.aread()
                return f"http {r.status_code}"
            first: float | None = None
            tail = b""
            async for chunk in r.aiter_raw():
                if first is None:
                    first = time.perf_counter() - t0
                tail = (tail + chunk)[-64:]
        if b"data: [DONE]" not in tail:
            return "no [DONE]"
        return time.perf_counter() - t0, first

    return one


async def run_cell(
    client_name: str, url: str, stream: bool, concurrency: int, duration_s: float, warmup_s: float
) -> Cell:
    body = chat_body(MODEL, stream)
    if client_name == "aiohttp":
        async with new_session() as session:
            req = aiohttp_request(session, url, body, stream)
            await closed_loop(req, concurrency, warmup_s)
            return await closed_loop(req, concurrency, duration_s)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(
        limits=limits, http1=True, http2=False, timeout=httpx.Timeout(120.0)
    ) as client:
        req = httpx_request(client, url, body, stream)
        await closed_loop(req, concurrency, warmup_s)
        return await closed_loop(req, concurrency, duration_s)


async def run_all(args: argparse.Namespace, url: str) -> dict[str, Any]:
    cells: dict[tuple[str, int, str], list[Cell]] = {}
    for rep in range(args.repeats):
        order = CLIENTS if rep % 2 == 0 else CLIENTS[::-1]
        for mode in MODES:
            for conc in args.concurrency:
                for client_name in order:
                    cell = await run_cell(
                        client_name, url, mode == "stream", conc, args.duration, args.warmup
                    )
                    cells.setdefault((mode, conc, client_name), []).append(cell)
                    if not args.json:
                        s = cell.summary()
                        print(
                            f"  round {rep + 1}/{args.repeats} {mode:10} c={conc:<3} "
                            f"{client_name:7} {s['rps']:8.1f} req/s  p50 {s['p50_ms']:7.2f} ms  "
                            f"p99 {s['p99_ms']:7.2f} ms  errors {sum(cell.errors.values())}",
                            file=sys.stderr,
                            flush=True,
                        )
    rows = []
    for mode in MODES:
        for conc in args.concurrency:
            row: dict[str, Any] = {"mode": mode, "concurrency": conc}
            for client_name in CLIENTS:
                cs = cells[(mode, conc, client_name)]
                errors: Counter = Counter()
                for c in cs:
                    errors.update(c.errors)
                row[client_name] = {
                    "rps": round(median([c.rps for c in cs]), 1),
                    "p50_ms": round(median([c.summary()["p50_ms"] for c in cs]), 3),
                    "p99_ms": round(median([c.summary()["p99_ms"] for c in cs]), 3),
                    "rps_runs": [round(c.rps, 1) for c in cs],
                    "ok": sum(c.ok for c in cs),
                    "errors": dict(errors),
                }
            a, h = row["aiohttp"], row["httpx"]
            row["rps_ratio_aiohttp_over_httpx"] = (
                round(a["rps"] / h["rps"], 3) if h["rps"] else None
            )
            row["p50_ratio_aiohttp_over_httpx"] = (
                round(a["p50_ms"] / h["p50_ms"], 3) if h["p50_ms"] else None
            )
            row["p99_ratio_aiohttp_over_httpx"] = (
                round(a["p99_ms"] / h["p99_ms"], 3) if h["p99_ms"] else None
            )
            rows.append(row)
    return {
        "benchmark": "http_clients",
        "settings": {
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "repeats": args.repeats,
            "concurrency": args.concurrency,
            "output_tokens": args.output_tokens,
            "python": platform.python_version(),
            "aiohttp": aiohttp.__version__,
            "httpx": httpx.__version__,
            "httpcore": httpcore.__version__,
        },
        "rows": rows,
    }


def print_table(result: dict[str, Any]) -> None:
    s = result["settings"]
    print(
        f"\nUpstream client benchmark: zero-delay simulator, {s['output_tokens']} output tokens, "
        f"{s['duration_s']} s per cell, median of {s['repeats']} interleaved runs "
        f"(aiohttp {s['aiohttp']}, httpx {s['httpx']}, httpcore {s['httpcore']}, "
        f"Python {s['python']})"
    )
    head = (
        f"{'mode':10} {'conc':>4} | {'aiohttp rps':>11} {'httpx rps':>10} {'ratio':>6} | "
        f"{'aio p50':>8} {'httpx p50':>9} | {'aio p99':>8} {'httpx p99':>9} | errors (aio/httpx)"
    )
    print(head)
    print("-" * len(head))
    for r in result["rows"]:
        a, h = r["aiohttp"], r["httpx"]
        ea, eh = sum(a["errors"].values()), sum(h["errors"].values())
        print(
            f"{r['mode']:10} {r['concurrency']:>4} | {a['rps']:>11.1f} {h['rps']:>10.1f} "
            f"{r['rps_ratio_aiohttp_over_httpx']:>6.2f} | "
            f"{a['p50_ms']:>6.2f}ms {h['p50_ms']:>7.2f}ms | "
            f"{a['p99_ms']:>6.2f}ms {h['p99_ms']:>7.2f}ms | {ea}/{eh}"
        )
    print("latencies in ms; ratio = aiohttp rps / httpx rps (> 1: aiohttp faster)")
    for r in result["rows"]:
        for name in CLIENTS:
            if r[name]["errors"]:
                print(f"ERRORS {r['mode']} c={r['concurrency']} {name}: {r[name]['errors']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=5.0, help="seconds per cell (default 5)")
    p.add_argument("--warmup", type=float, default=0.3, help="warm-up seconds per cell")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[16, 64])
    p.add_argument("--output-tokens", type=int, default=64, help="completion length (tokens)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    args = p.parse_args(argv)

    install_loop()
    raise_on_sigterm()
    procs = []
    try:
        sim = start_sim(MODEL, args.output_tokens)
        procs.append(sim.proc)
        url = sim.wait_ready()
        result = asyncio.run(run_all(args, url + "/v1/chat/completions"))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        stop_processes(procs)
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result)
    failed = any(r[n]["errors"] for r in result["rows"] for n in CLIENTS)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
