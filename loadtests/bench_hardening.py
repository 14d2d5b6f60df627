"""Hardening figures: what slow clients and long session ids cost one gateway process.

Starts one zero-delay simulator per tier and one gateway process with its default server
settings (the model's default tier is ``auto``, so the auto tier's session table is used too),
then measures the gateway's open file descriptors (``/proc/<pid>/fd``) and resident memory
(``VmRSS``):

- **slow clients**: ``--slow`` connections in four kinds, a quarter each: connects and sends
  nothing; sends its request headers a byte a second; sends complete headers and then its body a
  byte a second; sends headers with ``Content-Length: 100`` and no body. Each keeps trickling
  until the gateway closes it. Figures: before the connections, 3 s after they are all open, and
  ``--hold`` seconds later (default 35 s: past the default 20 s header and body timeouts); plus
  how many the gateway closed, and how.
- **long session ids**: ``--requests`` chat requests (concurrency 8, ``max_tokens`` 1), each
  with its own ``x-session-id`` of ``--id-chars`` characters. Figures: after 20 warm-up requests
  with short ids, and after the run.

Run: ``.venv/bin/python -m loadtests.bench_hardening`` (about a minute; ``--json`` for JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from loadtests._common import install_loop, new_session, start_gateway, start_sim, stop_processes

MODEL = "hard"
KINDS = ("idle", "slow-headers", "slow-body", "no-body")


def fds(pid: int) -> int:
    """Open file descriptors of process ``pid``."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_mib(pid: int) -> float:
    """Resident memory of process ``pid`` in MiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError("no VmRSS")


def _request(body: bytes, length: int | None = None) -> bytes:
    n = len(body) if length is None else length
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json"
            f"\r\nContent-Length: {n}\r\n\r\n").encode()


async def slow_client(host: str, port: int, kind: str, closed: dict[str, Any]) -> None:
    """One slow connection of ``kind``; records in ``closed`` when and how the gateway ended it
    (``408``, another status, or ``eof``)."""
    reader, writer = await asyncio.open_connection(host, port)
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()
    t0 = time.monotonic()
    trickle = b""
    if kind == "slow-headers":
        trickle = _request(body) + body
    elif kind == "slow-body":
        writer.write(_request(body))
        trickle = body
    elif kind == "no-body":
        writer.write(_request(b"", length=100))
    got = asyncio.ensure_future(reader.read(65536))
    i = 0
    try:
        while not got.done():
            if i < len(trickle):
                writer.write(trickle[i : i + 1])
                i += 1
                try:
                    await writer.drain()
                except OSError:
                    break
            await asyncio.wait([got], timeout=1.0)
        data = await got if not got.cancelled() else b""
    except OSError:
        data = b""
    status = data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/1.1 ") else "eof"
    closed[f"{kind}#{id(writer)}"] = (round(time.monotonic() - t0, 1), status)
    writer.close()


async def slow_clients(gw_url: str, pid: int, n: int, hold_s: float) -> dict[str, Any]:
    host, port = gw_url.removeprefix("http://").rsplit(":", 1)
    out: dict[str, Any] = {"connections": n, "fds_before": fds(pid), "rss_before_mib": rss_mib(pid)}
    closed: dict[str, Any] = {}
    tasks = [asyncio.ensure_future(slow_client(host, int(port), KINDS[i % 4], closed))
             for i in range(n)]
    await asyncio.sleep(3)
    out["fds_open"], out["rss_open_mib"] = fds(pid), rss_mib(pid)
    await asyncio.sleep(hold_s)
    out["fds_after_hold"], out["rss_after_hold_mib"] = fds(pid), rss_mib(pid)
    out["hold_s"] = hold_s
    out["closed_by_gateway"] = len(closed)
    out["how"] = dict(Counter(status for _, status in closed.values()))
    out["closed_after_s_max"] = max((t for t, _ in closed.values()), default=None)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return out


async def long_session_ids(gw_url: str, pid: int, requests: int, chars: int) -> dict[str, Any]:
    body = json.dumps({"model": MODEL, "max_tokens": 1,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    headers = {"Content-Type": "application/json"}
    errors: Counter[str] = Counter()
    async with new_session() as s:
        async def one(sid: str) -> None:
            async with s.post(gw_url + "/v1/chat/completions", data=body,
                              headers={**headers, "x-session-id": sid}) as r:
                await r.read()
                if r.status != 200:
                    errors[f"http {r.status}"] += 1

        for i in range(20):
            await one(f"warm-{i}")
        await asyncio.sleep(1)
        out: dict[str, Any] = {"requests": requests, "id_chars": chars,
                               "fds_before": fds(pid), "rss_before_mib": rss_mib(pid)}
        queue = iter(range(requests))

        async def worker() -> None:
            for _ in queue:
                await one(secrets.token_hex(chars // 2 + 1)[:chars])

        await asyncio.gather(*(worker() for _ in range(8)))
        await asyncio.sleep(1)
    out["fds_after"], out["rss_after_mib"] = fds(pid), rss_mib(pid)
    out["rss_growth_mib"] = round(out["rss_after_mib"] - out["rss_before_mib"], 1)
    out["errors"] = dict(errors)
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    procs = []
    try:
        sims = [start_sim(MODEL, 4) for _ in range(2)]
        procs += [s.proc for s in sims]
        urls = [s.wait_ready() for s in sims]
        tmp = Path(tempfile.mkdtemp(prefix="speedgate-hardening-"))
        cfg = {"server": {"port": 0, "log_level": "warning"},
               "models": {MODEL: {"default_tier": "auto", "tiers": {
                   "standard": {"served_model_name": MODEL, "endpoints": [urls[0]]},
                   "fast": {"served_model_name": MODEL, "endpoints": [urls[1]]}}}}}
        results: dict[str, Any] = {}
        for name in ("slow_clients", "long_session_ids"):
            (tmp / "gw.yaml").write_text(yaml.safe_dump(cfg))
            gw = start_gateway(str(tmp / "gw.yaml"), str(tmp / f"{name}.log"))
            procs.append(gw.proc)
            url = gw.wait_ready("/readyz")
            await asyncio.sleep(1)
            if name == "slow_clients":
                results[name] = await slow_clients(url, gw.pid, args.slow, args.hold)
            else:
                results[name] = await long_session_ids(url, gw.pid, args.requests, args.id_chars)
            stop_processes([gw.proc])
        return results
    finally:
        stop_processes(procs)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--slow", type=int, default=50, help="slow client connections")
    p.add_argument("--hold", type=float, default=35.0, help="seconds to keep them trickling")
    p.add_argument("--requests", type=int, default=1500, help="requests with long session ids")
    p.add_argument("--id-chars", type=int, default=30_000, help="characters per session id")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    install_loop()
    res = asyncio.run(run(args))
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        sc, li = res["slow_clients"], res["long_session_ids"]
        print(f"slow clients ({sc['connections']}): fds {sc['fds_before']} -> {sc['fds_open']} "
              f"-> {sc['fds_after_hold']} after {sc['hold_s']:.0f} s; RSS {sc['rss_before_mib']}"
              f" -> {sc['rss_open_mib']} -> {sc['rss_after_hold_mib']} MiB; closed by the "
              f"gateway: {sc['closed_by_gateway']} {sc['how']}")
        print(f"long session ids ({li['requests']} x {li['id_chars']} chars): RSS "
              f"{li['rss_before_mib']} -> {li['rss_after_mib']} MiB (+{li['rss_growth_mib']}); "
              f"fds {li['fds_before']} -> {li['fds_after']}; errors {li['errors']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
