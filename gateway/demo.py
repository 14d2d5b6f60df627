"""``speedgate demo``: simulated standard and fast pools plus a gateway, on localhost.

Starts ``replicas_per_tier`` engine simulators per tier (``python -m engines.sim``; the fast
pool in speculative mode) on ports they bind themselves, waits for their ``/health``, then
serves the gateway in this process. Ctrl-C or SIGTERM stops the gateway and every simulator
(they also die with this process: each runs in its own process group and is killed on exit).
"""

from __future__ import annotations

import atexit
import shlex
import signal
import sys
from collections.abc import Callable

from engines.procs import stop_processes, write_port_file
from engines.sim.spawn import SimProcess, spawn_simulator
from gateway.config import GatewayConfig
from gateway.server import run_server

MODEL = "mymodel"


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
    py = shlex.quote(sys.executable)  # this venv's interpreter: works from any shell
    return f"""
speedgate demo: gateway on {base}
  API:     {base}/v1   (OpenAI-compatible)
  console: {base}/console   (live pools, tiers, sessions; open it in a browser)
  standard pool: {", ".join(standard)}
  fast pool (speculative decoding): {", ".join(fast)}

Try it:
  curl -s {base}/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{{"model": "{MODEL}", "service_tier": "priority",
         "messages": [{{"role": "user", "content": "Hello!"}}]}}' -i

  {py} -m pip install -q openai   # the OpenAI SDK, once
  {py} -c "from openai import OpenAI; c = OpenAI(base_url='{base}/v1', api_key='unused'); \\
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
    port_file: str | None = None,
) -> int:
    """Run the demo until interrupted; returns the exit status. ``engine``: ``sim`` (the
    simulator) or ``vllm`` (real vLLM on CPU with a tiny random-weight model, see
    ``engines.vllm``; installs its venv on first use). ``port`` 0 lets the kernel pick the
    gateway's port; it is printed in the banner and written to ``port_file`` when given."""
    if engine == "vllm":
        return _run_vllm_demo(port, host, replicas_per_tier, port_file)
    sims: list[tuple[str, SimProcess]] = []

    def start() -> dict[str, list[str]]:
        seed = 0
        for tier, mode in (("standard", "standard"), ("fast", "speculative")):
            for _ in range(replicas_per_tier):
                sims.append((tier, spawn_simulator(mode, time_scale, seed, model=MODEL)))
                seed += 1
        urls: dict[str, list[str]] = {"standard": [], "fast": []}
        for tier, sim in sims:  # they boot in parallel; each reports the port it bound
            urls[tier].append(sim.wait_ready())
        return urls

    return _serve_demo(
        start, lambda: stop_processes([s.proc for _, s in sims]), host, port, port_file
    )


def _run_vllm_demo(
    port: int, host: str, replicas_per_tier: int, port_file: str | None = None
) -> int:
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
                replicas.append(start_replica(tier, None, run_dir / f"{tier}{i}", python=python,
                                              model_path=model, served_model_name=MODEL))
        print(f"speedgate demo: starting {len(replicas)} vLLM replicas (logs in {run_dir})...",
              file=sys.stderr, flush=True)
        for r in replicas:
            r.wait_healthy()  # may restart it on another port if its port was taken meanwhile
            urls[r.tier].append(r.url)
        return urls

    return _serve_demo(start, lambda: stop_replicas(replicas), host, port, port_file)


def _serve_demo(
    start: Callable[[], dict[str, list[str]]],
    stop: Callable[[], None],
    host: str,
    port: int,
    port_file: str | None = None,
) -> int:
    """Start the engines (``start`` returns their URLs per tier), serve the gateway in front
    of them until Ctrl-C or SIGTERM, and always ``stop`` the engines (also at exit). A
    gateway port that is taken is exit status 1 with a line saying so, not a traceback."""
    atexit.register(stop)

    def _terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    try:
        urls = start()

        def listening(bound: int) -> None:
            print(_banner(host, bound, urls["standard"], urls["fast"]), flush=True)
            if port_file:
                write_port_file(port_file, bound)

        run_server(demo_config(urls["standard"], urls["fast"], host, port), on_listen=listening)
    except KeyboardInterrupt:
        pass
    except RuntimeError as e:
        print(f"speedgate demo: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # the gateway's listener: the address is taken
        print(f"speedgate demo: cannot listen on {host}:{port}: {e.strerror or e} (is another "
              "demo running? `make demo PORT=9000` or `speedgate demo --port 9000` picks "
              "another port)", file=sys.stderr)
        return 1
    finally:
        stop()
    return 0
