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
from gateway.capacity.kv_size import DEFAULT_KV_SIZE, DEMO_MAX_MODEL_LEN, KvSize
from gateway.capacity.kv_size import kv_size as replica_kv_size
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


def _banner(host: str, port: int, standard: list[str], fast: list[str],
            limits: str = "", max_model_len: int | None = None) -> str:
    """The start-up lines: where things are, a first request, and each coding agent's settings
    for this port (the complete files are ``docs/agents/``). ``limits``: a line on the
    replicas' context and KV pool; ``max_model_len``: the context the agents are told."""
    base = f"http://{host}:{port}"
    py = shlex.quote(sys.executable)  # this venv's interpreter: works from any shell
    window = f"\n                  model_context_window = {max_model_len}" if max_model_len else ""
    limit = (f'"limit": {{"context": {max_model_len}, "output": 32000}}'
             if max_model_len else "")
    return f"""
speedgate demo: gateway on {base}
  API:     {base}/v1   (OpenAI-compatible; Anthropic Messages at {base}/v1/messages)
  console: {base}/console   (live pools, tiers, sessions; open it in a browser)
  standard pool: {", ".join(standard)}
  fast pool (speculative decoding): {", ".join(fast)}{limits}

Try it:
  curl -s {base}/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{{"model": "{MODEL}", "service_tier": "priority",
         "messages": [{{"role": "user", "content": "Hello!"}}]}}' -i

  {py} -m pip install -q openai   # the OpenAI SDK, once
  {py} -c "from openai import OpenAI; c = OpenAI(base_url='{base}/v1', api_key='unused'); \\
r = c.chat.completions.create(model='{MODEL}-fast', \\
messages=[{{'role': 'user', 'content': 'Hi'}}]); \\
print(r.service_tier, r.choices[0].message.content)"

Coding agents (complete config files: docs/agents/; base URL {base}, any key):
  Claude Code:  ANTHROPIC_BASE_URL={base} ANTHROPIC_AUTH_TOKEN=unused \\
                ANTHROPIC_MODEL={MODEL}-fast ANTHROPIC_DEFAULT_HAIKU_MODEL={MODEL} claude
  Codex:        SPEEDGATE_API_KEY=unused codex   with ~/.codex/config.toml:
                  model = "{MODEL}-fast"
                  model_provider = "speedgate"{window}
                  [model_providers.speedgate]
                  name = "speedgate"
                  base_url = "{base}/v1"
                  wire_api = "responses"
                  env_key = "SPEEDGATE_API_KEY"
  OpenCode:     opencode   with opencode.json:
                  {{"$schema": "https://opencode.ai/config.json",
                   "model": "speedgate/{MODEL}-fast",
                   "provider": {{"speedgate": {{"npm": "@ai-sdk/openai-compatible",
                     "options": {{"baseURL": "{base}/v1", "apiKey": "unused"}},
                     "models": {{"{MODEL}-fast": {{{limit}}}}}}}}}}}

Models: {MODEL} (standard), {MODEL}-fast, {MODEL}-standard, {MODEL}-auto.  Ctrl-C stops everything.
"""


def _limits_line(max_model_len: int, kv: KvSize) -> str:
    """The banner's line on the simulated replicas' context and KV pool."""
    return (f"\n  each replica: max_model_len {max_model_len:,} tokens, KV pool {kv.tokens:,} "
            f"tokens ({kv.num_blocks:,} blocks x {kv.block_size})\n    sized as {kv.source}")


def run_demo(
    port: int = 8080,
    host: str = "127.0.0.1",
    replicas_per_tier: int = 2,
    time_scale: float = 1.0,
    engine: str = "sim",
    port_file: str | None = None,
    max_model_len: int = DEMO_MAX_MODEL_LEN,
    kv_size: str = DEFAULT_KV_SIZE,
) -> int:
    """Run the demo until interrupted; returns the exit status. ``engine``: ``sim`` (the
    simulator) or ``vllm`` (real vLLM on CPU with a tiny random-weight model, see
    ``engines.vllm``; installs its venv on first use). ``port`` 0 lets the kernel pick the
    gateway's port; it is printed in the banner and written to ``port_file`` when given.
    ``max_model_len`` (tokens) and ``kv_size`` (``gateway.capacity.kv_size``: a token count
    or a capacity preset) size each simulated replica (the simulator only); a pool that does
    not hold one ``max_model_len`` sequence is exit status 2 with a line saying so."""
    if engine == "vllm":
        if (max_model_len, kv_size) != (DEMO_MAX_MODEL_LEN, DEFAULT_KV_SIZE):
            print("speedgate demo: --max-model-len and --kv-size size the simulator; the vLLM "
                  "replicas keep their own (engines.vllm.launcher)", file=sys.stderr)
        return _run_vllm_demo(port, host, replicas_per_tier, port_file)
    try:
        kv = replica_kv_size(kv_size, max_model_len)
    except ValueError as e:
        print(f"speedgate demo: {e}", file=sys.stderr)
        return 2
    if kv.tokens < max_model_len:
        print(f"speedgate demo: a KV pool of {kv.tokens:,} tokens ({kv.source}) does not hold "
              f"one sequence of --max-model-len {max_model_len:,} tokens (vLLM would not "
              "start): lower --max-model-len or raise --kv-size", file=sys.stderr)
        return 2
    sims: list[tuple[str, SimProcess]] = []
    sim_args = ("--max-model-len", str(max_model_len), "--block-size", str(kv.block_size),
                "--num-gpu-blocks", str(kv.num_blocks))

    def start() -> dict[str, list[str]]:
        seed = 0
        for tier, mode in (("standard", "standard"), ("fast", "speculative")):
            for _ in range(replicas_per_tier):
                sims.append((tier, spawn_simulator(mode, time_scale, seed, sim_args,
                                                   model=MODEL)))
                seed += 1
        urls: dict[str, list[str]] = {"standard": [], "fast": []}
        for tier, sim in sims:  # they boot in parallel; each reports the port it bound
            urls[tier].append(sim.wait_ready())
        return urls

    return _serve_demo(
        start, lambda: stop_processes([s.proc for _, s in sims]), host, port, port_file,
        _limits_line(max_model_len, kv), max_model_len,
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
    limits: str = "",
    max_model_len: int | None = None,
) -> int:
    """Start the engines (``start`` returns their URLs per tier), serve the gateway in front
    of them until Ctrl-C or SIGTERM, and always ``stop`` the engines (also at exit). A
    gateway port that is taken is exit status 1 with a line saying so, not a traceback.
    ``limits``, ``max_model_len``: the engines' sizes for the banner (``_banner``)."""
    atexit.register(stop)

    def _terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    try:
        urls = start()

        def listening(bound: int) -> None:
            print(_banner(host, bound, urls["standard"], urls["fast"], limits, max_model_len),
                  flush=True)
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
