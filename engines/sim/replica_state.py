"""Per-replica state shared by the handlers: config, engine, cache, metrics, faults, request log."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from engines.sim.config import SimConfig
from engines.sim.engine import Engine
from engines.sim.faults import Faults
from engines.sim.kvcache import PrefixCache
from engines.sim.metrics import SimMetrics
from engines.sim.textgen import TextGen

REQUEST_LOG_SIZE = 32


@dataclass(slots=True)
class Counts:
    """``/sim/stats`` counters since start or the last ``/sim/reset``."""

    requests: int = 0
    aborted: int = 0
    completed: int = 0


@dataclass(slots=True)
class SimState:
    """Everything one replica holds; created by :func:`engines.sim.app.build_app`."""

    config: SimConfig
    cache: PrefixCache
    metrics: SimMetrics
    engine: Engine
    textgen: TextGen
    faults: Faults
    started: float = field(default_factory=time.monotonic)
    created: int = field(default_factory=lambda: int(time.time()))
    counts: Counts = field(default_factory=Counts)
    log: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=REQUEST_LOG_SIZE))

    @classmethod
    def from_config(cls, config: SimConfig) -> SimState:
        """Build the cache, metrics, engine and text generator for ``config``."""
        cache = PrefixCache(config.num_gpu_blocks, config.block_size)
        metrics = SimMetrics(config.model, config.perf.speculative,
                             num_gpu_blocks=config.num_gpu_blocks, block_size=config.block_size)
        engine = Engine(
            config.perf, cache, metrics,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            time_scale=config.time_scale,
            seed=config.seed,
            scheduling_policy=config.scheduling_policy,
            preemption=config.preemption,
        )
        return cls(config, cache, metrics, engine, TextGen(config.seed), config.faults)

    @property
    def ready(self) -> bool:
        """False during ``--slow-start-s`` after start."""
        return time.monotonic() - self.started >= self.config.slow_start_s

    def record(self, request: web.Request, body: Any) -> dict[str, Any]:
        """Log a received request (``GET /sim/requests``) and count it."""
        entry = {
            "path": request.path,
            "headers": {k.lower(): v for k, v in request.headers.items()},  # names lowercased
            "body": body,
            "aborted": False,
            "completed": False,
        }
        self.log.append(entry)
        self.counts.requests += 1
        self.metrics.sim_requests.inc()
        return entry


STATE: web.AppKey[SimState] = web.AppKey("sim_state", SimState)
