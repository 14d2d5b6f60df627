"""Start and stop one real vLLM OpenAI server for a tier, on CPU, with the tiny model.

``start_replica(tier, port, ...)`` runs ``python -m vllm.entrypoints.openai.api_server`` from the
vLLM venv (``engines.vllm.venv``) with the flags measured to work on the project's 2-core CPU
machines (``BASE_FLAGS``; the flags the gateway relies on, ``--enable-prefix-caching
--enable-prompt-tokens-details``, included) and, for the ``fast`` tier, ngram speculative decoding
(``NGRAM_SPEC``, vLLM's prompt-lookup drafter: no draft model needed). Each replica gets a private
``TMPDIR`` and ``VLLM_CACHE_ROOT`` under its run folder, ``HF_HUB_OFFLINE=1`` and
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (engine core in the API server's process: one process per
replica, ~1.6 GB), its own session (process group) and ``PR_SET_PDEATHSIG`` (it dies with its
parent, even a SIGKILLed one). ``VllmReplica.wait_healthy`` polls ``/health`` (~20 s cold);
``stop`` sends SIGTERM to the group and SIGKILL after a grace period (~2 s measured).

CPU facts that differ from a GPU deployment: the KV cache is sized in bytes
(``--kv-cache-memory-bytes``) instead of ``--gpu-memory-utilization``, and the CPU backend's KV
block size is 128 tokens (GPU: 16), which is the prefix-cache granularity.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from engines.procs import die_with_parent, free_port

TIERS = ("standard", "fast")
CPU_BLOCK_SIZE = 128
MAX_PORT_RETRIES = 3  # fresh ports tried when the picked one was taken before vLLM bound it
NGRAM_SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
BASE_FLAGS: tuple[str, ...] = (
    "--dtype", "bfloat16",
    "-O0",  # no torch.compile / graph capture: healthy in seconds, not minutes
    "--distributed-executor-backend", "uni",
    "--kv-cache-memory-bytes", "64M",
    "--max-model-len", "2048",
    "--max-num-seqs", "16",
    "--enable-prefix-caching",
    "--enable-prompt-tokens-details",
    "--disable-uvicorn-access-log",
)  # fmt: skip


def serve_args(
    tier: str, port: int, model_path: Path, served_model_name: str, host: str = "127.0.0.1"
) -> list[str]:
    """The server's arguments (after ``python``) for ``tier`` (``standard`` | ``fast``)."""
    if tier not in TIERS:
        raise ValueError(f"tier must be one of {TIERS}, not {tier!r}")
    args = [
        "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_path),
        "--served-model-name", served_model_name,
        "--host", host,
        "--port", str(port),
        *BASE_FLAGS,
    ]
    if tier == "fast":
        args += ["--speculative-config", json.dumps(NGRAM_SPEC, separators=(",", ":"))]
    return args


def replica_env(run_dir: Path) -> dict[str, str]:
    """The server's environment: ours plus offline mode, one process, private temp/cache."""
    tmp = run_dir / "tmp"
    cache = run_dir / "vllm-cache"
    tmp.mkdir(parents=True, exist_ok=True)
    cache.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIRTUAL_ENV")}
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        TOKENIZERS_PARALLELISM="false",
        TMPDIR=str(tmp),
        VLLM_CACHE_ROOT=str(cache),
        PYTHONUNBUFFERED="1",
    )
    return env


@dataclass
class VllmReplica:
    """A running vLLM server: ``url`` (no ``/v1``), the process, its log file."""

    tier: str
    url: str
    proc: subprocess.Popen
    log_path: Path
    run_dir: Path
    started: float = field(default_factory=time.monotonic)
    # set when the port was picked here (``start_replica(port=None)``): how to start again on a
    # fresh port when another process took it between the pick and vLLM's bind
    relaunch: Callable[[int], tuple[subprocess.Popen, str]] | None = None
    port_retries: int = 0

    def log(self, tail: int = 6000) -> str:
        """The last ``tail`` characters of the server's output."""
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except OSError:
            return ""

    def wait_healthy(self, timeout_s: float = 180) -> float:
        """Block until ``GET /health`` answers 200; seconds since start. Raises
        ``RuntimeError`` with the log's tail when the server exits or the timeout passes."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None and self._port_was_taken():
                self.port_retries += 1
                self.proc, self.url = self.relaunch(free_port())  # type: ignore[misc]
                continue
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"vLLM {self.tier} replica exited ({self.proc.returncode}):\n{self.log()}"
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return time.monotonic() - self.started
            except OSError:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"vLLM {self.tier} replica not healthy after {timeout_s:.0f}s:\n"
                           f"{self.log()}")

    def _port_was_taken(self) -> bool:
        """True when the server exited because its port was bound by someone else and it may
        be started again on another (at most ``MAX_PORT_RETRIES`` times)."""
        return (
            self.relaunch is not None
            and self.port_retries < MAX_PORT_RETRIES
            and "address already in use" in self.log().lower()
        )

    def stop(self, grace_s: float = 10) -> None:
        """SIGTERM the replica's process group; SIGKILL after ``grace_s``; remove its temp."""
        stop_replicas([self], grace_s)


def start_replica(
    tier: str,
    port: int | None,
    run_dir: Path,
    *,
    python: Path,
    model_path: Path,
    served_model_name: str = "mymodel",
    host: str = "127.0.0.1",
    extra_args: tuple[str, ...] = (),
    extra_env: dict[str, str] | None = None,
) -> VllmReplica:
    """Start a vLLM server for ``tier`` on ``port`` (returns at once; then ``wait_healthy``).
    ``run_dir`` gets the log (``vllm.log``) and the private temp and cache folders.

    ``port=None`` picks a free port here; vLLM cannot bind port 0 and report it, so when the
    port is taken before vLLM binds it (``address already in use``), ``wait_healthy`` starts
    the server again on a fresh port and ``url`` changes: read it after ``wait_healthy``.
    ``extra_env`` is added to ``replica_env`` (e.g. ``VLLM_CPU_KVCACHE_SPACE``)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / "vllm.log"

    def launch(p: int) -> tuple[subprocess.Popen, str]:
        cmd = [str(python), *serve_args(tier, p, model_path, served_model_name, host),
               *extra_args]
        with log_path.open("wb") as log:
            log.write(("$ " + " ".join(cmd) + "\n").encode())
            log.flush()
            proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=replica_env(run_dir) | (extra_env or {}),
                cwd=run_dir,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        return proc, f"http://{host}:{p}"

    proc, url = launch(free_port(host) if port is None else port)
    return VllmReplica(tier, url, proc, log_path, run_dir,
                       relaunch=launch if port is None else None)


def stop_replicas(replicas: list[VllmReplica], grace_s: float = 10) -> None:
    """SIGTERM every replica's process group at once, SIGKILL those alive after ``grace_s``,
    reap them and remove their private temp folders."""
    for r in replicas:
        if r.proc.poll() is None:
            try:
                os.killpg(r.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace_s
    for r in replicas:
        try:
            r.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(r.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            r.proc.wait()
        try:  # anything left in the group (a helper the server spawned) goes too
            os.killpg(r.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        shutil.rmtree(r.run_dir / "tmp", ignore_errors=True)
