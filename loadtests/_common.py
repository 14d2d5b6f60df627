"""Shared pieces of the benchmarks: request bodies, a lean closed-loop load generator,
statistics, process start/stop and table printing.

The load loop is closed: ``concurrency`` workers each send requests back to back until the
window ends (no new request starts after it; the ones in flight are finished and counted).
Every failure is counted by kind (``http 502``, ``ClientOSError``, ``no [DONE]``...) and never
hidden: cells report ``errors`` and the scripts print them.
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from gateway.demo import die_with_parent, stop_processes, wait_healthy

JSON_HEADERS = {"Content-Type": "application/json"}
# Read at most this much of a response to classify it; a chat completion here is far smaller.
MAX_ERROR_PREVIEW = 200


def chat_body(model: str, stream: bool, max_tokens: int | None = None) -> bytes:
    """A small chat request, pre-encoded (the same bytes every time)."""
    doc: dict[str, Any] = {
        "model": model,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Write a short poem about load balancers."},
        ],
        "stream": stream,
    }
    if max_tokens is not None:
        doc["max_tokens"] = max_tokens
    return orjson.dumps(doc)


def long_chat_body(model: str, mib: float, max_tokens: int = 16) -> bytes:
    """A long agent-style conversation of about ``mib`` MiB of JSON (~4 KiB per message)."""
    para = "The quick brown fox jumps over the lazy dog, then reads the build log again. " * 60
    para = para[:4000]
    n = max(1, int(mib * 1024 * 1024) // (len(para) + 40))
    msgs = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}: {para}"}
        for i in range(n)
    ]
    return orjson.dumps({"model": model, "messages": msgs, "max_tokens": max_tokens})


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by nearest rank; NaN when empty."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def median(values: list[float]) -> float:
    vals = [v for v in values if v == v]  # drop NaN
    return statistics.median(vals) if vals else float("nan")


@dataclass
class Cell:
    """One measured window: completed requests, errors by kind, latencies in seconds."""

    ok: int = 0
    elapsed_s: float = 0.0
    lat: list[float] = field(default_factory=list)
    ttfb: list[float] = field(default_factory=list)
    errors: Counter = field(default_factory=Counter)

    @property
    def rps(self) -> float:
        return self.ok / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "rps": round(self.rps, 1),
            "p50_ms": round(pct(self.lat, 0.5) * 1e3, 3),
            "p99_ms": round(pct(self.lat, 0.99) * 1e3, 3),
            "ttfb_p50_ms": round(pct(self.ttfb, 0.5) * 1e3, 3) if self.ttfb else None,
            "ok": self.ok,
            "errors": dict(self.errors),
        }


# One request: returns (latency_s, ttfb_s or None) or raises / returns an error string.
RequestFn = Callable[[], Awaitable["tuple[float, float | None] | str"]]


async def closed_loop(request: RequestFn, concurrency: int, duration_s: float) -> Cell:
    """Run ``concurrency`` workers calling ``request`` back to back for ``duration_s``."""
    cell = Cell()
    t0 = time.perf_counter()
    end = t0 + duration_s

    async def worker() -> None:
        while time.perf_counter() < end:
            try:
                res = await request()
            except Exception as e:  # counted, never hidden
                cell.errors[type(e).__name__] += 1
                continue
            if isinstance(res, str):
                cell.errors[res] += 1
                continue
            cell.ok += 1
            cell.lat.append(res[0])
            if res[1] is not None:
                cell.ttfb.append(res[1])

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    cell.elapsed_s = time.perf_counter() - t0
    return cell


def aiohttp_request(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    stream: bool,
    headers: dict[str, str] | None = None,
) -> RequestFn:
    """A request function for ``closed_loop``: POST ``body`` and read the whole response
    (every SSE chunk when ``stream``); checks status 200 and a complete body. ``headers`` are
    sent besides ``Content-Type`` (e.g. ``Authorization``)."""
    hdrs = {**JSON_HEADERS, **(headers or {})}

    async def one() -> tuple[float, float | None] | str:
        t0 = time.perf_counter()
        async with session.post(url, data=body, headers=hdrs) as r:
            if r.status != 200:
                await r.read()
                return f"http {r.status}"
            if not stream:
                data = await r.read()
                if b'"choices"' not in data:
                    return "bad body"
                return time.perf_counter() - t0, None
            first: float | None = None
            tail = b""
            async for chunk in r.content.iter_any():
                if first is None:
                    first = time.perf_counter() - t0
                tail = (tail + chunk)[-64:]
            if b"data: [DONE]" not in tail:
                return "no [DONE]"
            return time.perf_counter() - t0, first

    return one


def new_session() -> aiohttp.ClientSession:
    """A lean aiohttp client session: unlimited pool, no timeouts besides a generous total."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, limit_per_host=0),
        timeout=aiohttp.ClientTimeout(total=120),
        skip_auto_headers=("User-Agent",),
        auto_decompress=False,
    )


def install_loop() -> None:
    """Use uvloop when installed (the gateway runs on it too)."""
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def raise_on_sigterm() -> None:
    """Turn SIGTERM into KeyboardInterrupt so ``finally`` blocks stop the child processes."""

    def _raise(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _raise)


def _child_setup(cpus: set[int] | None) -> Callable[[], None]:
    """``preexec_fn``: die with the parent; pin to ``cpus`` when given."""

    def setup() -> None:
        die_with_parent()
        if cpus:
            os.sched_setaffinity(0, cpus)

    return setup


def start_sim(
    port: int,
    model: str,
    output_tokens: int,
    extra: tuple[str, ...] = (),
    cpus: set[int] | None = None,
) -> subprocess.Popen:
    """A zero-delay simulator (``--time-scale 0``) serving ``model`` on ``port``, in its own
    process group (like ``gateway.demo.start_simulator``), optionally pinned to ``cpus``."""
    cmd = [
        sys.executable, "-m", "engines.sim",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--served-model-name", model,
        "--time-scale", "0",
        "--output-tokens", str(output_tokens),
        *extra,
    ]  # fmt: skip
    return subprocess.Popen(
        cmd,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        preexec_fn=_child_setup(cpus),
    )


def start_gateway(
    config_path: str, log_path: str, cpus: set[int] | None = None
) -> subprocess.Popen:
    """``python -m gateway serve -c config_path``, output to ``log_path``, own process group."""
    log = open(log_path, "wb")  # the child keeps its own descriptor; closed here below
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "-c", config_path],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_child_setup(cpus),
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    finally:
        log.close()


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` and its threads (Linux ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    # fields[0] is field 3 (state): utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_ready(url: str, proc: subprocess.Popen, path: str, timeout_s: float = 30.0) -> None:
    """Poll ``url + path`` until 200 (``wait_healthy`` with another path)."""
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process for {url} exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(url + path, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url}{path} not ready after {timeout_s:.0f}s")


__all__ = [
    "Cell",
    "aiohttp_request",
    "chat_body",
    "closed_loop",
    "cpu_seconds",
    "install_loop",
    "long_chat_body",
    "median",
    "new_session",
    "pct",
    "raise_on_sigterm",
    "start_gateway",
    "start_sim",
    "stop_processes",
    "wait_healthy",
    "wait_ready",
]
