"""The gateway's runtime state, created once per process in the app's lifespan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.config import GatewayConfig
from gateway.health import HealthChecker
from gateway.metrics import GatewayMetrics
from gateway.pools import PoolRegistry
from gateway.telemetry import Telemetry
from gateway.tiers import ModelIndex
from gateway.upstream import Upstream
from gateway.usage_store import UsageStore

if TYPE_CHECKING:
    from gateway.auto.service import AutoTier


@dataclass(slots=True)
class GatewayState:
    """Everything a request needs: config, name index, pools, upstream client, health probes,
    metrics, traces and the usage totals store; ``auto``: the auto tier's live estimates."""

    config: GatewayConfig
    models: ModelIndex
    pools: PoolRegistry
    upstream: Upstream
    health: HealthChecker
    metrics: GatewayMetrics
    telemetry: Telemetry
    usage: UsageStore
    auto: AutoTier | None = None
