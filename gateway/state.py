"""The gateway's runtime state, created once per process in the app's lifespan."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.config import GatewayConfig
from gateway.health import HealthChecker
from gateway.metrics import GatewayMetrics
from gateway.pools import PoolRegistry
from gateway.tiers import ModelIndex
from gateway.upstream import Upstream


@dataclass(slots=True)
class GatewayState:
    """Everything a request needs: config, name index, pools, upstream client, health, metrics."""

    config: GatewayConfig
    models: ModelIndex
    pools: PoolRegistry
    upstream: Upstream
    health: HealthChecker
    metrics: GatewayMetrics
