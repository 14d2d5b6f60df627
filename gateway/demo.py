"""``speedgate demo``: simulated standard and fast pools plus a gateway, on localhost.

Starts ``replicas_per_tier`` engine simulators per tier (``python -m engines.sim``; the fast
pool in speculative mode) on free ports, waits for their ``/health``, then serves the gateway in
this process. Ctrl-C or SIGTERM stops the gateway and every simulator (they also die with this
process: each runs in its own process group and is killed on exit).
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable

from gateway.config import GatewayConfig

MODEL = "mymodel"


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_simulator(
    port: int,
    mode: str,
    time_scale: float,
    seed: int,
    extra_args: tuple[str, ...] = (),
    model: str = MODEL,
) -> subprocess.Popen:
    """Start one engine simulator serving ``model`` on ``port`` (``mode``: standard |
    speculative; ``extra_args``: more ``engines.sim`` flags). Its stderr is inherited."""
    cmd = [
        sys.executable, "-m", "engines.sim",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--served-model-name", model,
        "--mode", mode,
        "--time-scale", str(time_scale),
        "--seed", str(seed),
        *extra_args,
    ]
    return subprocess.Popen(
        cmd, start_new_session=True, stdout=subprocess.DEVNULL, preexec_fn=die_with_parent
    )


def die_with_parent() -> None:
    """In a child process (``preexec_fn``): get SIGTERM when the parent dies, even by SIGKILL,
    so no engine process outlives the demo or a test run (Linux ``PR_SET_PDEATHSIG``)."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """Poll ``url + /health`` until 200. Raises ``RuntimeError`` if the process exits or the
    timeout passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"simulator at {url} exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"simulator at {url} not healthy after {timeout_s:.0f}s")


def stop_processes(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each process group, then SIGKILL what is still alive after 5 s."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 5
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def demo_config(standard: list[str], fast: list[str], host: str, port: int) -> GatewayConfig:
    """The demo's config: one model, both tiers, aliases ``-fast``/``-standard``/``-auto``."""
    timeouts = {"connect_s": 2, "ttft_s": 60, "stall_s": 30, "total_s": 600}
    return GatewayConfig(
        server={"host": host, "port": port},
        health={"interval_s": 2},
        models={
            MODEL: {
                "default_tier": "standard",
                "aliases": {
                    f"{MODEL}-fast": "fast",
                    f"{MODEL}-standard": "standard",
                    f"{MODEL}-auto": "auto",
                },
                "fallback": {"fast": "standard"},
                "tiers": {
                    "standard": {
                        "served_model_name": MODEL,
                        "endpoints": standard,
                        "timeouts": timeouts,
                        "prices": {"input_per_mtok_usd": 1.0, "cached_input_per_mtok_usd": 0.1,
                                   "output_per_mtok_usd": 2.0},
                    },
                    "fast": {
                        "served_model_name": MODEL,
                        "endpoints": fast,
                        "timeouts": timeouts,
                        "prices": {"input_per_mtok_usd": 2.0, "cached_input_per_mtok_usd": 0.2,
                                   "output_per_mtok_usd": 6.0},
                    },
                },
            }
        },
    )


def _banner(host: str, port: int, standard: list[str], fast: list[str]) -> str:
    base = f"http://{host}:{port}"
    return f"""
speedgate demo: gateway on {base}
  standard pool: {", ".join(standard)}
  fast pool (speculative decoding): {", ".join(fast)}

Try it:
  curl -s {base}/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{{"model": "{MODEL}", "service_tier": "priority",
         "messages": [{{"role": "user", "content": "Hello!"}}]}}' -i

  python -c "from openai import OpenAI; c = OpenAI(base_url='{base}/v1', api_key='unused'); \\
r = c.chat.completions.create(model='{MODEL}-fast', \\
messages=[{{'role': 'user', 'content': 'Hi'}}]); \\
print(r.service_tier, r.choices[0].message.content)"

Models: {MODEL} (standard), {MODEL}-fast, {MODEL}-standard, {MODEL}-auto.  Ctrl-C stops everything.
"""


def run_demo(
    port: int = 8080,
    host: str = "127.0.0.1",
    replicas_per_tier: int = 2,
    time_scale: float = 1.0,
    engine: str = "sim",
) -> int:
    """Run the demo until interrupted; returns the exit status. ``engine``: ``sim`` (the
    simulator) or ``vllm`` (real vLLM on CPU with a tiny random-weight model, see
    ``engines.vllm``; installs its venv on first use)."""
    if engine == "vllm":
        return _run_vllm_demo(port, host, replicas_per_tier)
    procs: list[subprocess.Popen] = []

    def start() -> dict[str, list[str]]:
        urls: dict[str, list[str]] = {"standard": [], "fast": []}
        seed = 0
        for tier, mode in (("standard", "standard"), ("fast", "speculative")):
            for _ in range(replicas_per_tier):
                p = free_port()
                procs.append(start_simulator(p, mode, time_scale, seed))
                urls[tier].append(f"http://127.0.0.1:{p}")
                seed += 1
        for proc, url in zip(procs, urls["standard"] + urls["fast"], strict=True):
            wait_healthy(url, proc)
        return urls

    return _serve_demo(start, lambda: stop_processes(procs), host, port)


def _run_vllm_demo(port: int, host: str, replicas_per_tier: int) -> int:
    """``run_demo`` on real vLLM: ``replicas_per_tier`` CPU vLLM servers per tier (the fast
    ones with ngram speculative decoding), each ~1.6 GB and ~30 s to start."""
    import tempfile
    from pathlib import Path

    from engines.vllm import prepare
    from engines.vllm.launcher import VllmReplica, start_replica, stop_replicas

    replicas: list[VllmReplica] = []
    run_dir = Path(tempfile.mkdtemp(prefix="speedgate-vllm-demo-"))

    def start() -> dict[str, list[str]]:
        python, model = prepare()
        urls: dict[str, list[str]] = {"standard": [], "fast": []}
        for tier in ("standard", "fast"):
            for i in range(replicas_per_tier):
                r = start_replica(tier, free_port(), run_dir / f"{tier}{i}", python=python,
                                  model_path=model, served_model_name=MODEL)
                replicas.append(r)
                urls[tier].append(r.url)
        print(f"speedgate demo: starting {len(replicas)} vLLM replicas (logs in {run_dir})...",
              file=sys.stderr, flush=True)
        for r in replicas:
            r.wait_healthy()
        return urls

    return _serve_demo(start, lambda: stop_replicas(replicas), host, port)


def _serve_demo(
    start: Callable[[], dict[str, list[str]]], stop: Callable[[], None], host: str, port: int
) -> int:
    """Start the engines (``start`` returns their URLs per tier), serve the gateway in front
    of them until Ctrl-C or SIGTERM, and always ``stop`` the engines (also at exit)."""
    from gateway.cli import run_server

    atexit.register(stop)

    def _terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    try:
        urls = start()
        print(_banner(host, port, urls["standard"], urls["fast"]), flush=True)
        run_server(demo_config(urls["standard"], urls["fast"], host, port))
    except KeyboardInterrupt:
        pass
    except RuntimeError as e:
        print(f"speedgate demo: {e}", file=sys.stderr)
        return 1
    finally:
        stop()
    return 0
