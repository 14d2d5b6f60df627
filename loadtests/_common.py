"""Shared pieces of the benchmarks: request bodies, a lean closed-loop load generator,
statistics, process start/stop and table printing.

Servers started here (simulators, gateways) bind port 0 themselves and write the port they got
to a port file (``--port 0 --port-file PATH``, see ``engines.procs``); no port is chosen free
beforehand and bound later (a race another process can win on a busy machine).

The load loop is closed: ``concurrency`` workers each send requests back to back until the
window ends (no new request starts after it; the ones in flight are finished and counted).
Every failure is counted by kind (``http 502``, ``ClientOSError``, ``no [DONE]``...) and never
hidden: cells report ``errors`` and the scripts print them.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from engines.procs import die_with_parent, stop_processes, wait_healthy, wait_port_file

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


def responses_body(model: str, stream: bool) -> bytes:
    """The same small request as ``chat_body`` for the Responses API, pre-encoded."""
    return orjson.dumps({
        "model": model, "instructions": "You are a helpful assistant.",
        "input": "Write a short poem about load balancers.", "stream": stream,
    })


def messages_body(model: str, stream: bool, max_tokens: int = 1024) -> bytes:
    """The same small request as ``chat_body`` for Anthropic Messages (``max_tokens`` is
    required there; the simulator still stops at its natural length), pre-encoded."""
    return orjson.dumps({
        "model": model, "system": "You are a helpful assistant.", "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "Write a short poem about load balancers."}],
        "stream": stream,
    })


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
    *,
    body_marker: bytes = b'"choices"',
    end_marker: bytes = b"data: [DONE]",
) -> RequestFn:
    """A request function for ``closed_loop``: POST ``body`` and read the whole response
    (every SSE chunk when ``stream``); checks status 200 and a complete body: a JSON answer
    containing ``body_marker``, a stream containing ``end_marker`` (its last event: chat's
    ``[DONE]``, ``event: response.completed``, ``event: message_stop``). ``headers`` are sent
    besides ``Content-Type`` (e.g. ``Authorization``)."""
    hdrs = {**JSON_HEADERS, **(headers or {})}
    keep = len(end_marker)

    async def one() -> tuple[float, float | None] | str:
        t0 = time.perf_counter()
        async with session.post(url, data=body, headers=hdrs) as r:
            if r.status != 200:
                await r.read()
                return f"http {r.status}"
            if not stream:
                data = await r.read()
                if body_marker not in data:
                    return "bad body"
                return time.perf_counter() - t0, None
            first: float | None = None
            tail = b""
            ended = False
            async for chunk in r.content.iter_any():
                if first is None:
                    first = time.perf_counter() - t0
                window = tail + chunk
                ended = ended or end_marker in window
                tail = window[-keep:]
            if not ended:
                return "no last event"
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


@dataclass
class Server:
    """A child server started on port 0 with ``--port-file``: ``proc``; ``url``
    (``http://host:port``) once :meth:`wait_port` or :meth:`wait_ready` returned."""

    proc: subprocess.Popen
    port_file: Path
    host: str = "127.0.0.1"
    url: str = ""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_port(self, timeout_s: float = 30.0) -> str:
        """Block until the server wrote the port it bound; its URL. Raises ``RuntimeError`` if
        it exits or ``timeout_s`` (seconds) pass."""
        if not self.url:
            try:
                port = wait_port_file(self.port_file, self.proc, timeout_s)
            finally:
                shutil.rmtree(self.port_file.parent, ignore_errors=True)
            self.url = f"http://{self.host}:{port}"
        return self.url

    def wait_ready(self, path: str = "/health", timeout_s: float = 30.0) -> str:
        """:meth:`wait_port`, then poll ``url + path`` until 200; the URL. Raises
        ``RuntimeError`` if the server exits or ``timeout_s`` (seconds, each wait) pass."""
        url = self.wait_port(timeout_s)
        wait_ready(url, self.proc, path, timeout_s)
        return url


def _spawn_server(
    cmd: list[str],
    cpus: set[int] | None,
    stdout: Any = subprocess.DEVNULL,
    stderr: Any = None,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> Server:
    """Start ``cmd + ['--port-file', PATH]`` (``cmd`` asks for port 0) in its own process
    group, dying with this process, pinned to ``cpus`` when given, in ``cwd`` when given.
    Returns at once."""
    port_file = Path(tempfile.mkdtemp(prefix="speedgate-bench-port-")) / "port"
    try:
        proc = subprocess.Popen(
            [*cmd, "--port-file", str(port_file)],
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
            preexec_fn=_child_setup(cpus),
            env=env,
            cwd=cwd,
        )
    except BaseException:
        shutil.rmtree(port_file.parent, ignore_errors=True)
        raise
    return Server(proc, port_file)


def start_sim(
    model: str,
    output_tokens: int,
    extra: tuple[str, ...] = (),
    cpus: set[int] | None = None,
) -> Server:
    """A zero-delay simulator (``--time-scale 0``) serving ``model`` on a port it binds itself
    (``--port 0``, reported through a port file), in its own process group (like
    ``engines.sim.spawn.spawn_simulator``), optionally pinned to ``cpus``. Returns at once:
    start several, then call ``Server.wait_ready()`` on each (they boot in parallel)."""
    cmd = [
        sys.executable, "-m", "engines.sim",
        "--host", "127.0.0.1",
        "--port", "0",
        "--served-model-name", model,
        "--time-scale", "0",
        "--output-tokens", str(output_tokens),
        "--accept-sim-faults",  # benchmarks pace the engine per request (sim_faults)
        *extra,
    ]  # fmt: skip
    return _spawn_server(cmd, cpus)


def start_raw_engine(
    model: str, chunks: int, cpus: set[int] | None = None, pace_s: float = 0.0
) -> Server:
    """The raw zero-delay engine (``loadtests.raw_engine``: pre-serialised answers, ``chunks``
    chat chunks per stream; ``pace_s`` > 0: one write per event, that many seconds apart)
    answering as ``model``, on a port it binds itself, optionally pinned to ``cpus``. Returns
    at once; ``Server.wait_ready("/health")`` waits for it."""
    cmd = [sys.executable, "-m", "loadtests.raw_engine", "--port", "0",
           "--served-model-name", model, "--chunks", str(chunks), "--pace-s", str(pace_s)]
    return _spawn_server(cmd, cpus)


def start_floor_proxy(upstream: str, cpus: set[int] | None = None) -> Server:
    """``loadtests.floor_proxy`` (the gateway's HTTP stack passing bodies through, nothing
    else) in front of ``upstream``, on a port it binds itself, optionally pinned to ``cpus``.
    Returns at once; ``Server.wait_ready("/readyz")`` waits for it."""
    cmd = [sys.executable, "-m", "loadtests.floor_proxy", "--upstream", upstream, "--port", "0"]
    return _spawn_server(cmd, cpus)


def start_gateway(
    config_path: str, log_path: str, cpus: set[int] | None = None, source: str | None = None
) -> Server:
    """``python -m gateway serve -c config_path --port 0`` (the port it binds is reported
    through a port file), output to ``log_path``, own process group, optionally pinned to
    ``cpus``; ``source``: run the ``gateway`` package of another checkout (e.g. a base commit,
    to compare in one run). Returns at once; ``Server.wait_ready("/readyz")`` waits for it."""
    log = open(log_path, "wb")  # the child keeps its own descriptor; closed here below
    try:
        return _spawn_server(
            [sys.executable, "-m", "gateway", "serve", "-c", config_path, "--port", "0"],
            cpus,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1",
                 **({"PYTHONPATH": source} if source else {})},
            cwd=source,
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
    """Poll ``url + path`` until 200 (``engines.procs.wait_healthy`` with another path).
    Raises ``RuntimeError`` if ``proc`` exits or ``timeout_s`` (seconds) pass."""
    wait_healthy(url, proc, timeout_s, path)


__all__ = [
    "Cell",
    "Server",
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
    "start_raw_engine",
    "start_sim",
    "stop_processes",
    "wait_healthy",
    "wait_ready",
]
