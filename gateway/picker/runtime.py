"""The picker's runtime state: the parts of a gateway process that decide, without the relay.

Built from the same config as ``speedgate serve`` (``GatewayConfig``): pools and their
replicas, the model index (tiers, aliases), the routing service (prefix and session affinity,
bounded load, the state store), active health probes and the ``/metrics`` load scraper,
passive outlier ejection, admission (priority bands, pool queues, session budgets), API keys
and rate limits, and the auto tier's live estimates. ``start``/``stop`` run inside the
picker's event loop, in the order of the gateway's lifespan (``gateway.app``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from gateway.admit.admission import AdmissionControl, build_admission
from gateway.admit.gate import Gate
from gateway.common.redis_conn import RedisConnection
from gateway.config import GatewayConfig
from gateway.fleet.pools import PoolRegistry
from gateway.picker.kube import KubePods
from gateway.plan.auto.service import AutoTier
from gateway.plan.tiers import ModelIndex
from gateway.routing.service import RoutingService
from gateway.upstream.client import Upstream
from gateway.upstream.discovery import DnsDiscovery, start_discoveries
from gateway.upstream.health import HealthChecker
from gateway.upstream.load_scraper import LoadScraper

log = logging.getLogger("speedgate.picker")


@dataclass(slots=True, eq=False)
class PickerRuntime:
    """Everything a pick needs. ``ready`` turns True once ``start`` has run (and every
    discovery source answered once): the gRPC ``readiness`` check reports it."""

    config: GatewayConfig
    pools: PoolRegistry
    models: ModelIndex
    gate: Gate
    admission: AdmissionControl
    auto: AutoTier
    redis: RedisConnection | None
    upstream: Upstream | None = None
    health: HealthChecker | None = None
    routing: RoutingService | None = None
    scraper: LoadScraper | None = None
    discoveries: list[DnsDiscovery] = field(default_factory=list)
    pod_watches: list[KubePods] = field(default_factory=list)
    ready: bool = False

    @classmethod
    def build(cls, config: GatewayConfig) -> PickerRuntime:
        """The runtime of ``config`` (not started). Raises ``ConfigError`` as the gateway
        does (a keys file naming an unknown band, ...)."""
        pools = PoolRegistry(config)
        redis = RedisConnection.from_config(config.state)
        return cls(
            config=config, pools=pools, models=ModelIndex(config),
            gate=Gate(config, redis=redis), admission=build_admission(config, pools),
            auto=AutoTier(config, pools), redis=redis,
        )

    def watch_pods(self, model: str, api: str, namespace: str, selector: str,
                   target_port: int, **options: object) -> KubePods:
        """Take ``model``'s endpoints from the Kubernetes pods of ``selector`` (both tiers'
        pods in one pool, tier by label: ``gateway.picker.kube``) instead of the config's
        ``endpoints``, which serve until the first list; ``options`` go to ``KubePods``.
        Raises ``ValueError`` for a model not in the config."""
        if model not in self.config.models:
            raise ValueError(f"--k8s-model {model!r} is not a model of the config")
        pools = {p.tier: p for p in self.pools.all() if p.model == model}
        default = self.config.models[model].default_tier
        options.setdefault("default_tier", default if default != "auto" else "standard")

        def apply(by_tier: dict[str, list[str]]) -> None:
            for tier, pool in pools.items():
                pool.set_endpoints(by_tier.get(tier, []))
            for label in set(by_tier) - set(pools):
                log.warning("pods labelled tier %r: model %s has no such tier", label, model)

        watch = KubePods(api, namespace, selector, target_port, apply, **options)  # type: ignore[arg-type]
        self.pod_watches.append(watch)
        return watch

    async def start(self) -> None:
        """Start the upstream client (health probes and ``/metrics`` scrapes only: the
        picker never carries a request), DNS discovery, the pod watches (waiting for their
        first list: not ready before), probes, routing and the auto tier."""
        self.upstream = upstream = Upstream(self.config.upstream)
        self.health = HealthChecker(self.config.health, self.pools, upstream)
        self.routing = RoutingService(self.config, self.pools, redis=self.redis)
        self.scraper = LoadScraper(self.pools, upstream)  # engine load: routing and auto read it
        self.discoveries.extend(await start_discoveries(self.pools))
        for watch in self.pod_watches:
            watch.start()
            await watch.synced.wait()
        self.health.start()
        self.routing.start()
        self.scraper.start()
        self.auto.start()
        self.ready = True

    async def stop(self) -> None:
        """Stop everything ``start`` started, then the stores (idempotent enough for a
        shutdown path: each part is stopped once)."""
        self.ready = False
        await self.auto.stop()
        if self.scraper is not None:
            await self.scraper.stop()
        if self.routing is not None:
            await self.routing.stop()
        for disc in self.discoveries:
            await disc.stop()
        for watch in self.pod_watches:
            await watch.stop()
        if self.health is not None:
            await self.health.stop()
        if self.upstream is not None:
            await self.upstream.close()
        await self.gate.close()
        if self.redis is not None:
            await self.redis.close()
        await self.admission.close()
