"""A real stack for end-to-end tests: simulator replicas and a gateway, as processes.

``Stack.start()`` launches ``n`` simulators per tier on ports they bind themselves (port 0,
reported back), writes a gateway config and runs ``python -m gateway serve`` on port 0 too;
``stop()`` terminates every process group (the children also get SIGTERM if the test process
dies: ``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from engines.procs import spawn_reporting_port, stop_processes
from engines.sim.spawn import spawn_simulator, start_simulator

MODEL = "mymodel"


@dataclass
class Stack:
    """Handles on a running stack: ``base_url`` of the gateway, simulator URLs per tier."""

    tmp: Path
    replicas_per_tier: int = 2
    timeouts: dict = field(
        default_factory=lambda: {"connect_s": 2, "ttft_s": 5, "stall_s": 3, "total_s": 60}
    )
    # 1M-token context like the served model; KV room for one full-length conversation
    sim_args: tuple[str, ...] = (
        "--time-scale", "0.02", "--max-model-len", "1048576", "--num-gpu-blocks", "70000"
    )
    pool_overrides: dict = field(default_factory=dict)  # merged into every tier's pool config
    tier_overrides: dict[str, dict] = field(default_factory=dict)  # merged into one tier's
    extra_endpoints: dict[str, list[str]] = field(default_factory=dict)  # non-simulator replicas
    health: dict = field(default_factory=lambda: {"interval_s": 0.5, "timeout_s": 1})
    config_extra: dict = field(default_factory=dict)  # top-level config sections (state, ...)
    model_overrides: dict = field(default_factory=dict)  # merged into the model's config (auto)
    config: dict = field(default_factory=dict)
    tiers: tuple[str, ...] = ("standard", "fast")  # pools to start (aliases need both)
    accept_sim_faults: bool = True  # False: simulators refuse per-request sim_faults (400)
    procs: list[subprocess.Popen] = field(default_factory=list)
    sims: dict[str, list[str]] = field(default_factory=dict)
    sim_procs: dict[str, subprocess.Popen] = field(default_factory=dict)  # by URL
    base_url: str = ""
    gateway: subprocess.Popen | None = None
    log_path: Path | None = None

    def start(self) -> Stack:
        try:
            seed = 0
            spawned = []
            for tier, mode in (("standard", "standard"), ("fast", "speculative")):
                if tier not in self.tiers:
                    continue
                self.sims[tier] = []
                for _ in range(self.replicas_per_tier):
                    sim = spawn_simulator(mode, 1.0, seed, self.sim_args,
                                          accept_sim_faults=self.accept_sim_faults)
                    self.procs.append(sim.proc)
                    spawned.append((tier, sim))
                    seed += 1
            for tier, sim in spawned:  # booted in parallel; each reports the port it bound
                self.sims[tier].append(sim.wait_ready())
                self.sim_procs[sim.url] = sim.proc
            cfg = {
                "server": {"port": 0, "max_body_bytes": 8 * 1024 * 1024},
                "health": self.health,
                **self.config_extra,
                "models": {
                    MODEL: {
                        **({"aliases": {f"{MODEL}-fast": "fast", f"{MODEL}-auto": "auto"},
                            "fallback": {"fast": "standard"}} if len(self.tiers) == 2 else {}),
                        **self.model_overrides,
                        "tiers": {
                            tier: {
                                "served_model_name": MODEL,
                                "endpoints": urls + self.extra_endpoints.get(tier, []),
                                "timeouts": self.timeouts,
                                **self.pool_overrides,
                                **self.tier_overrides.get(tier, {}),
                            }
                            for tier, urls in self.sims.items()
                        },
                    }
                },
            }
            self.config = cfg
            self.gateway, self.base_url = self._spawn_gateway("gateway")
            self._wait_gateway()
            return self
        except BaseException:
            self.stop()
            raise

    def _spawn_gateway(self, name: str) -> tuple[subprocess.Popen, str]:
        """Start ``python -m gateway serve`` on port 0 with the stack's config; it reports the
        port it bound (``--port-file``). Output goes to ``<tmp>/<name>.log``."""
        cfg = {**self.config, "server": {**self.config["server"], "port": 0}}
        cfg_path = self.tmp / f"{name}.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg))
        log_path = self.tmp / f"{name}.log"
        if name == "gateway":
            self.log_path = log_path
        with log_path.open("wb") as log:
            try:
                proc, url = spawn_reporting_port(
                    [sys.executable, "-m", "gateway", "serve", "-c", str(cfg_path)],
                    stdout=log,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"},
                )
            except RuntimeError as e:
                raise RuntimeError(f"{e}:\n{log_path.read_text()}") from None
        self.procs.append(proc)
        return proc, url

    def add_gateway(self) -> str:
        """Start one more gateway replica with the same config (another port); its URL."""
        n = len(list(self.tmp.glob("gateway*.yaml")))
        proc, url = self._spawn_gateway(f"gateway{n}")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"gateway {url} exited")
            try:
                with urllib.request.urlopen(url + "/healthz", timeout=1) as r:
                    if r.status == 200:
                        return url
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"gateway {url} not up")

    def _wait_gateway(self, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        assert self.gateway is not None
        while time.monotonic() < deadline:
            if self.gateway.poll() is not None:
                raise RuntimeError("gateway exited:\n" + self.log())
            try:
                with urllib.request.urlopen(self.base_url + "/healthz", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("gateway not up:\n" + self.log())

    def log(self) -> str:
        """The gateway's output so far (access log lines included)."""
        return self.log_path.read_text() if self.log_path and self.log_path.exists() else ""

    def stop(self) -> None:
        stop_processes(self.procs)

    def kill_sim(self, url: str, crash: bool = False) -> None:
        """Stop the simulator at ``url``: SIGTERM (it drains, SIGKILL after 5 s), or with
        ``crash`` SIGKILL at once."""
        p = self.sim_procs[url]
        if crash:
            p.kill()
            p.wait()
        else:
            stop_processes([p])

    def restart_sim(self, url: str) -> None:
        """Start a simulator again on the same port (after ``kill_sim``) and wait for it."""
        old = self.sim_procs[url]
        tier = next(t for t, urls in self.sims.items() if url in urls)
        mode = "standard" if tier == "standard" else "speculative"
        # the same replica comes back at the same address (as a restarted pod behind a stable
        # name would): the one place a port is reused, right after its owner released it
        p = start_simulator(mode, 1.0, 0, self.sim_args, port=int(url.rsplit(":", 1)[1])).proc
        self.procs[self.procs.index(old)] = p
        self.sim_procs[url] = p

    def all_sims(self) -> list[str]:
        return [u for urls in self.sims.values() for u in urls]

    def reset_sims(self) -> None:
        """Clear stats, request logs, KV caches and replica faults of every simulator."""
        with httpx.Client(timeout=5) as c:
            for u in self.all_sims():
                c.post(u + "/sim/reset").raise_for_status()
                c.delete(u + "/sim/faults").raise_for_status()

    def sim_requests(self, tier: str | None = None) -> list[dict]:
        """Requests the simulators received (tier's replicas, or all), oldest first."""
        out: list[dict] = []
        with httpx.Client(timeout=5) as c:
            for t, urls in self.sims.items():
                if tier is None or t == tier:
                    for u in urls:
                        out.extend(c.get(u + "/sim/requests").json())
        return out

    def sim_stats(self, tier: str | None = None) -> dict[str, int]:
        """Summed ``/sim/stats`` counters of the tier's replicas (or all)."""
        total: dict[str, int] = {}
        with httpx.Client(timeout=5) as c:
            for t, urls in self.sims.items():
                if tier is None or t == tier:
                    for u in urls:
                        for k, v in c.get(u + "/sim/stats").json().items():
                            if isinstance(v, int | float):
                                total[k] = total.get(k, 0) + v
        return total


RESUME_SIM_ARGS = ("--time-scale", "0.02", "--seed", "0", "--output-tokens", "30")


def resume_stack(path: Path, budget_min_retries: int) -> Stack:
    """The (not started) stack of the resume tests: 2 simulators per tier (time scale 0.02,
    seed 0, 30 tokens), short staged timeouts (stall 1 s), up to 3 resumes per stream, outlier
    ejection off (every break is a scripted fault), a retry budget of at least
    ``budget_min_retries`` retries."""
    return Stack(path, replicas_per_tier=2, sim_args=RESUME_SIM_ARGS,
                 timeouts={"connect_s": 1, "ttft_s": 3, "stall_s": 1, "total_s": 30},
                 pool_overrides={"resume": {"max_resumes": 3},
                                 "retry": {"budget_min_retries": budget_min_retries},
                                 "outlier": {"enabled": False}})
