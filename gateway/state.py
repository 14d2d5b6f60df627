"""The gateway's runtime state, created once per process in the app's lifespan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.admit.admission import AdmissionControl
from gateway.config import GatewayConfig
from gateway.fleet.pools import PoolRegistry
from gateway.plan.tiers import ModelIndex
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.tracing import Telemetry
from gateway.telemetry.usage_store import UsageStore
from gateway.upstream.client import Upstream
from gateway.upstream.health import HealthChecker

if TYPE_CHECKING:
    from gateway.console.recorder import ConsoleRecorder
    from gateway.plan.auto.service import AutoTier


@dataclass(slots=True)
class GatewayState:
    """Everything a request needs: config, name index, pools, upstream client, health probes,
    metrics, traces and the usage totals store; ``admission``: priority bands, pool queues and
    session budgets; ``auto``: the auto tier's live estimates; ``console``: the console's live
    windows (None when the console is disabled)."""

    config: GatewayConfig
    models: ModelIndex
    pools: PoolRegistry
    upstream: Upstream
    health: HealthChecker
    metrics: GatewayMetrics
    telemetry: Telemetry
    usage: UsageStore
    admission: AdmissionControl
    auto: AutoTier | None = None
    console: ConsoleRecorder | None = None
