"""Active health probes: ``GET /health`` of every replica on an interval."""

from __future__ import annotations

import asyncio
import logging

from gateway.common.tasks import cancel_and_wait, every
from gateway.config import HealthConfig
from gateway.fleet.pools import PoolRegistry, Replica
from gateway.upstream.client import Upstream, UpstreamConnectError

log = logging.getLogger("speedgate.health")


class HealthChecker:
    """Probes each replica every ``interval_s``; ``unhealthy_threshold`` failures in a row mark
    it down, ``healthy_threshold`` successes mark it up. A probe fails on a non-200 status, a
    connection error or ``timeout_s``. Replicas start healthy (optimistic) until probed."""

    def __init__(self, config: HealthConfig, pools: PoolRegistry, upstream: Upstream) -> None:
        self.config = config
        self.pools = pools
        self.upstream = upstream
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the probe loop (no-op when disabled)."""
        if self.config.enabled and self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                every(self.config.interval_s, self.probe_all)
            )

    async def stop(self) -> None:
        """Stop the probe loop."""
        await cancel_and_wait([self._task])
        self._task = None

    async def probe_all(self) -> None:
        """Probe every replica once, concurrently, and update its state."""
        await asyncio.gather(*(self._probe(r) for r in self.pools.replicas()))

    async def _probe(self, replica: Replica) -> None:
        try:
            status, _ = await self.upstream.get(replica.url + "/health", self.config.timeout_s)
            ok = status == 200
        except UpstreamConnectError:
            ok = False
        record_probe(replica, ok, self.config)


def record_probe(replica: Replica, ok: bool, config: HealthConfig) -> None:
    """Apply one probe result to ``replica`` with the thresholds of ``config``. Pure."""
    if ok:
        replica.consecutive_probe_failures = 0
        replica.consecutive_probe_successes += 1
        if not replica.healthy and replica.consecutive_probe_successes >= config.healthy_threshold:
            replica.healthy = True
            log.warning("replica %s (%s) is healthy again", replica.safe_url, replica.pool_key)
    else:
        replica.consecutive_probe_successes = 0
        replica.consecutive_probe_failures += 1
        if replica.healthy and replica.consecutive_probe_failures >= config.unhealthy_threshold:
            replica.healthy = False
            log.warning("replica %s (%s) marked unhealthy", replica.safe_url, replica.pool_key)
