"""Real vLLM replicas (one standard, one ngram-speculative) plus a gateway, as processes.

``VllmStack.start()`` installs or reuses the vLLM venv and the tiny model
(``engines.vllm.prepare``; an install failure raises, so the suite fails, it is never skipped),
starts both replicas in parallel, waits for their ``/health`` (~30 s on 2 cores), then runs
``python -m gateway serve`` on the demo's config (``gateway.demo.demo_config``, so its prices and
aliases) with one extra model, ``ghost``, whose served name no engine serves (vLLM's own 404).
``stop()`` stops everything (SIGTERM, then SIGKILL); every child also dies with this process.
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
from prometheus_client.parser import text_string_to_metric_families

from engines.procs import spawn_reporting_port, stop_processes
from engines.vllm import prepare
from engines.vllm.launcher import VllmReplica, start_replica, stop_replicas
from gateway.demo import MODEL, demo_config

GHOST = "ghost"  # a gateway model whose served_model_name vLLM does not serve


def scrape(url: str, names: tuple[str, ...] | None = None) -> dict[str, float]:
    """``/metrics`` of ``url`` as ``{'name{label=value,...}': value}`` (labels sorted, the
    ``engine``/``model_name`` labels dropped), only samples whose name is in ``names``."""
    text = httpx.get(url + "/metrics", timeout=10).text
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if names is not None and s.name not in names:
                continue
            labels = ",".join(
                f"{k}={v}" for k, v in sorted(s.labels.items()) if k not in ("engine", "model_name")
            )
            key = f"{s.name}{{{labels}}}" if labels else s.name
            out[key] = out.get(key, 0.0) + s.value
    return out


@dataclass
class VllmStack:
    """Handles on the running stack: gateway ``base_url``, replica URLs by tier."""

    tmp: Path
    replicas: dict[str, VllmReplica] = field(default_factory=dict)
    gateway: subprocess.Popen | None = None
    base_url: str = ""
    startup_s: dict[str, float] = field(default_factory=dict)

    @property
    def standard(self) -> str:
        return self.replicas["standard"].url

    @property
    def fast(self) -> str:
        return self.replicas["fast"].url

    def start(self) -> VllmStack:
        t0 = time.monotonic()
        try:
            python, model = prepare()
            self.startup_s["prepare"] = time.monotonic() - t0
            for tier in ("standard", "fast"):
                self.replicas[tier] = start_replica(
                    tier, None, self.tmp / tier, python=python, model_path=model,
                    served_model_name=MODEL,
                )
            for tier, r in self.replicas.items():
                self.startup_s[tier] = r.wait_healthy(timeout_s=240)
            self._start_gateway()
            self.startup_s["total"] = time.monotonic() - t0
            return self
        except BaseException:
            self.stop()
            raise

    def _start_gateway(self) -> None:
        cfg = demo_config([self.standard], [self.fast], "127.0.0.1", 0).model_dump(mode="json")
        timeouts = {"connect_s": 5, "ttft_s": 60, "stall_s": 30, "total_s": 180}
        for pool in cfg["models"][MODEL]["tiers"].values():
            pool["timeouts"] = timeouts
        # the contract tests read the refusal of prompt + cap beside the context (lowering the
        # cap, the default, would have vLLM write ~2,000 tokens on CPU)
        cfg["models"][MODEL]["output_cap_overflow"] = "refuse"
        ghost = {**cfg["models"][MODEL]["tiers"]["standard"], "served_model_name": GHOST}
        cfg["models"][GHOST] = {"tiers": {"standard": ghost}}
        # vLLM answers /health slowly while it computes on 2 busy cores
        cfg["health"] = {"interval_s": 1, "timeout_s": 10, "unhealthy_threshold": 5}
        path = self.tmp / "gateway.yaml"
        path.write_text(yaml.safe_dump(cfg))
        self.gateway_log = self.tmp / "gateway.log"
        with self.gateway_log.open("wb") as log:
            try:
                self.gateway, self.base_url = spawn_reporting_port(
                    [sys.executable, "-m", "gateway", "serve", "-c", str(path)],
                    stdout=log, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                )
            except RuntimeError as e:
                raise RuntimeError(f"{e}:\n{self.gateway_log.read_text()}") from None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.gateway.poll() is not None:
                raise RuntimeError("gateway exited:\n" + self.gateway_log.read_text())
            try:
                with urllib.request.urlopen(self.base_url + "/healthz", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("gateway not up:\n" + self.gateway_log.read_text())

    def stop(self) -> None:
        if self.gateway is not None:
            stop_processes([self.gateway])
        stop_replicas(list(self.replicas.values()))
