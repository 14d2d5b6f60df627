"""The routing service of one gateway process: state store (memory, or Redis through the
gateway's shared ``RedisConnection`` and its circuit breaker), one ``PoolRouter`` per pool, a
Redis watcher that notices recovery while idle, and the routing metrics. Started and stopped by
the app's lifespan (the engine load it routes on is scraped by ``gateway.upstream.load_scraper``).

Metrics (no session ids as labels): ``speedgate_state_store_degraded`` (1 while Redis is down,
whichever of its users noticed: routing then runs on consistent hashing),
``speedgate_state_store_circuit_opened_total`` (of the shared breaker),
``speedgate_routing_decisions_total{pool, reason}`` with reason ``prefix`` (the replica holding
the longest known prefix), ``session`` (the session's replica), ``new`` (nothing known),
``spill`` (affinity given up: the replica overloaded, tried or gone), ``rebalance`` (shed by a
replica over its share of active sessions, e.g. after an outage), ``hash_fallback``
(store down), ``round_robin``, ``scored``, ``no_route``;
``speedgate_kv_placements_total{pool, choice}``: turns weighed for KV room
(``routing.kv_placement``), ``stay``, ``move`` or ``wait``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.common.breaker import CircuitBreaker
from gateway.common.redis_conn import RedisConnection
from gateway.config import GatewayConfig
from gateway.fleet.pools import PoolRegistry
from gateway.routing.pipeline import PoolRouter
from gateway.routing.session_ledger_redis import RedisSessionLedger
from gateway.routing.store import MemoryRoutingStore, RedisRoutingStore


class RoutingService:
    """Owns the routing state; ``degraded`` is True while Redis is unreachable.

    ``redis``: the gateway's shared connection (its breaker is the one every Redis user
    reports to); None with ``state.redis_url`` set builds a private one (closed by ``stop``)."""

    def __init__(
        self,
        config: GatewayConfig,
        pools: PoolRegistry,
        redis: RedisConnection | None = None,
    ) -> None:
        st = config.state
        self.pools = pools
        self._own_redis = redis is None and st.redis_url is not None
        if self._own_redis:
            redis = RedisConnection.from_config(st)
        self.redis = redis
        self.breaker = redis.breaker if redis is not None else CircuitBreaker(
            "routing", failures=st.breaker_failures, cooldown_s=st.breaker_cooldown_s
        )
        self.store: MemoryRoutingStore | RedisRoutingStore
        if redis is not None:
            self.store = RedisRoutingStore(
                redis.client, redis.breaker, timeout_s=redis.timeout_s,
                prefix=st.routing_key_prefix,
            )
        else:
            self.store = MemoryRoutingStore()
        for pool in pools.all():
            rc = pool.config.routing
            self.store.configure(pool.key, rc.table_max_entries, rc.table_ttl_s,
                                 rc.table_max_bytes)
            router = PoolRouter(pool, self.store)
            if redis is not None:  # active sessions counted across every gateway replica
                router.shared_ledger = RedisSessionLedger(
                    redis.client, redis.breaker, router.ledger, pool=pool.key,
                    prefix=st.routing_key_prefix, timeout_s=redis.timeout_s,
                )
            pool.router = router
        self._watch: asyncio.Task[None] | None = None

    @property
    def degraded(self) -> bool:
        """True while the shared store is down (``/readyz`` says ``degraded``)."""
        return self.store.degraded

    def start(self) -> None:
        """With Redis, start the recovery watcher."""
        if isinstance(self.store, RedisRoutingStore):
            self._watch = asyncio.get_running_loop().create_task(self._watch_redis())

    async def _watch_redis(self) -> None:
        while True:
            await asyncio.sleep(self.breaker.cooldown_s / 2)
            if self.breaker.degraded:
                await self.store.ping()  # through the breaker: the half-open trial, if due

    async def stop(self) -> None:
        """Stop the tasks, flush pending writes, close the store."""
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        for pool in self.pools.all():
            if pool.router is not None:
                await pool.router.drain()
        await self.store.close()
        if self._own_redis and self.redis is not None:
            await self.redis.close()

    def register_metrics(self, registry: CollectorRegistry) -> Collector:
        """Expose the routing metrics in ``registry`` (the gateway's ``/metrics``); returns
        the collector (unregister it at shutdown)."""
        collector = _RoutingCollector(self)
        registry.register(collector)
        return collector


class _RoutingCollector(Collector):
    def __init__(self, service: RoutingService) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        s = self.service
        g = GaugeMetricFamily(
            "speedgate_state_store_degraded",
            "1 while the shared state store (Redis) is unreachable, as seen by any of its users "
            "(routing, rate limits, usage totals); routing falls back to consistent hashing on "
            "the session key",
        )
        g.add_metric([], 1.0 if s.degraded else 0.0)
        yield g
        c = CounterMetricFamily(
            "speedgate_state_store_circuit_opened",
            "Times the Redis circuit breaker (shared by every Redis user) opened",
        )
        c.add_metric([], float(s.breaker.opened))
        yield c
        d = CounterMetricFamily(
            "speedgate_routing_decisions", "Replica picks by reason", labels=["pool", "reason"]
        )
        for pool in s.pools.all():
            if pool.router is not None:
                for reason, n in sorted(pool.router.decisions.items()):
                    d.add_metric([pool.key, reason], float(n))
        yield d
        k = CounterMetricFamily(
            "speedgate_kv_placements", "Turns weighed for KV room, by choice (stay, move, wait)",
            labels=["pool", "choice"],
        )
        for pool in s.pools.all():
            if pool.router is not None:
                for choice, n in sorted(getattr(pool.router, "placements", {}).items()):
                    k.add_metric([pool.key, choice], float(n))
        yield k
