"""The gateway's runtime state: built once per process by ``build_state``, finished and immutable
from then on (the app's lifespan only starts and stops what it holds)."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.admit.admission import AdmissionControl, build_admission
from gateway.admit.flow.metrics import register_flow_metrics
from gateway.admit.session_end import SessionEnds
from gateway.common.redis_conn import RedisConnection
from gateway.config import GatewayConfig
from gateway.console.recorder import ConsoleRecorder
from gateway.fleet.pools import PoolRegistry
from gateway.plan.auto.service import AutoTier
from gateway.plan.tiers import ModelIndex
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.tracing import Telemetry
from gateway.telemetry.usage_store import MemoryUsageStore, RedisUsageStore, UsageStore
from gateway.upstream.client import Upstream
from gateway.upstream.health import HealthChecker


@dataclass(frozen=True, slots=True)
class GatewayState:
    """Everything a request needs: config, name index, pools, upstream client, health probes,
    metrics, traces and the usage totals store; ``admission``: priority bands, pool queues and
    session budgets; ``auto``: the auto tier's live estimates; ``console``: the console's live
    windows (None when the console is disabled); ``sessions``: ends sessions (explicitly or
    idle) and releases their state."""

    config: GatewayConfig
    models: ModelIndex
    pools: PoolRegistry
    upstream: Upstream
    health: HealthChecker
    metrics: GatewayMetrics
    telemetry: Telemetry
    usage: UsageStore
    admission: AdmissionControl
    auto: AutoTier
    console: ConsoleRecorder | None
    sessions: SessionEnds


def build_state(config: GatewayConfig, redis: RedisConnection | None) -> GatewayState:
    """The finished state of ``config``; ``redis``: the gateway's one shared connection (None
    without ``state.redis_url``: usage totals in memory). Nothing here needs a running loop:
    the upstream session, the probes and the background tasks start in the app's lifespan. The
    auto tier's, admission's and budgets' collectors are registered in the metrics registry."""
    pools = PoolRegistry(config)
    metrics = GatewayMetrics(pools)
    auto = AutoTier(config, pools)  # the auto tier's live estimates
    metrics.registry.register(auto.collector())
    admission = build_admission(config, pools)  # bands, pool queues, session budgets
    register_flow_metrics(admission.flow, metrics.registry)
    metrics.registry.register(admission.budgets.collector())
    upstream = Upstream(config.upstream)
    usage: UsageStore = (
        RedisUsageStore(redis.client, breaker=redis.breaker) if redis is not None
        else MemoryUsageStore()
    )
    console = ConsoleRecorder(config.console) if config.console.enabled else None
    idle_s = max((p.config.routing.session_idle_s for p in pools.all()), default=120.0)
    sessions = SessionEnds(pools, admission.budgets, usage, idle_s,
                           auto_tables=auto.sessions.values(),
                           on_end=console.session_ended if console is not None else None)
    return GatewayState(
        config=config,
        models=ModelIndex(config),
        pools=pools,
        upstream=upstream,
        health=HealthChecker(config.health, pools, upstream),
        metrics=metrics,
        telemetry=Telemetry(config.telemetry, registry=metrics.registry),
        usage=usage,
        admission=admission,
        auto=auto,
        console=console,
        sessions=sessions,
    )
