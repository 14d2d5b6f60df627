"""Prometheus metrics of the gateway (one registry per app; no global state).

Foundation set: requests by outcome and status, and in-flight requests per replica (read from
the pools at scrape time). Labels never carry an API key, a session id or a URL credential.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.access import RequestRecord
from gateway.pools import PoolRegistry

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _PoolCollector(Collector):
    """Scrape-time gauges from the live pool state."""

    def __init__(self, pools: PoolRegistry) -> None:
        self.pools = pools

    def collect(self) -> Iterator[Metric]:
        inflight = GaugeMetricFamily(
            "speedgate_replica_inflight",
            "Requests this gateway has open to the replica",
            labels=["pool", "replica"],
        )
        healthy = GaugeMetricFamily(
            "speedgate_replica_healthy",
            "1 when the replica passes its active health probes",
            labels=["pool", "replica"],
        )
        for r in self.pools.replicas():
            inflight.add_metric([r.pool_key, r.safe_url], r.inflight)
            healthy.add_metric([r.pool_key, r.safe_url], 1.0 if r.healthy else 0.0)
        yield inflight
        yield healthy


class GatewayMetrics:
    """The gateway's metrics; ``observe(rec)`` once per finished request."""

    def __init__(self, pools: PoolRegistry) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "speedgate_requests",
            "Finished requests by model, tier that served, outcome and HTTP status",
            ["model", "tier", "outcome", "status"],
            registry=self.registry,
        )
        self.registry.register(_PoolCollector(pools))

    def observe(self, rec: RequestRecord) -> None:
        """Count one finished request."""
        self.requests.labels(
            rec.model or "", rec.served_tier or "", rec.outcome or "", str(rec.status)
        ).inc()

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
