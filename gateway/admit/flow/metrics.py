"""Prometheus metrics of flow control (labels: pool, band, reason; never a key or session):

- ``speedgate_queue_length{pool, band}``: requests waiting in the gateway queue now;
- ``speedgate_queue_slots_in_use{pool}``: slots held by requests of a gated pool;
- ``speedgate_queue_drain_tokens_per_second{pool}``: the measured drain rate (estimated
  tokens dispatched per second of backlog) that expected waits and ``Retry-After`` come from;
- ``speedgate_queue_wait_seconds{pool, band}``: time waited in the queue by requests that
  waited (dispatched from the band they were served in);
- ``speedgate_queue_dispatched_total{pool, band}``: requests dispatched after waiting;
- ``speedgate_queue_shed_total{pool, band, reason}``: requests refused (``queue_full``,
  ``expected_wait`` at arrival, ``timeout`` after waiting);
- ``speedgate_queue_refusal_seconds{pool, band, reason}``: a refused request's time from its
  arrival at the gateway to the refusal (the gateway's part of the answer time; the
  issue's target is 50 ms for a refusal at arrival);
- ``speedgate_queue_promotions_total{pool, from_band, to_band}``: starvation-guard promotions.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.admit.flow.flow_control import FlowControl

# Seconds: a slot usually frees within milliseconds to seconds; flex/batch may wait minutes.
WAIT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
    300.0, 900.0,
)  # fmt: skip

# Seconds: a refusal at arrival should take milliseconds (target 50 ms); one after waiting, more.
REFUSAL_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 10.0, 60.0, 900.0,
)  # fmt: skip


class _FlowCollector(Collector):
    def __init__(self, flow: FlowControl) -> None:
        self.flow = flow

    def collect(self) -> Iterator[Metric]:
        f = self.flow
        length = GaugeMetricFamily("speedgate_queue_length",
                                   "Requests waiting in the gateway queue of the pool",
                                   labels=["pool", "band"])
        slots = GaugeMetricFamily("speedgate_queue_slots_in_use",
                                  "Slots held by requests on a pool with a saturation bound",
                                  labels=["pool"])
        drain = GaugeMetricFamily("speedgate_queue_drain_tokens_per_second",
                                  "Measured drain rate of the pool's queue (estimated tokens "
                                  "dispatched per second of backlog)", labels=["pool"])
        dispatched = CounterMetricFamily("speedgate_queue_dispatched",
                                         "Requests dispatched after waiting in the queue",
                                         labels=["pool", "band"])
        for key, pf in f.pools.items():
            if not pf.gated:
                continue
            for name, n in zip(f.band_names, pf.queue.lengths(), strict=True):
                length.add_metric([key, name], float(n))
                dispatched.add_metric([key, name], float(pf.dispatched[name]))
            slots.add_metric([key], float(pf.active))
            rate = pf.drain.rate()
            if rate is not None:
                drain.add_metric([key], rate)
        shed = CounterMetricFamily("speedgate_queue_shed", "Requests refused by flow control",
                                   labels=["pool", "band", "reason"])
        for (pool, band, reason), n in sorted(f.shed.items()):
            shed.add_metric([pool, band, reason], float(n))
        promoted = CounterMetricFamily("speedgate_queue_promotions",
                                       "Requests moved up a band by the starvation guard",
                                       labels=["pool", "from_band", "to_band"])
        for (pool, src, dst), n in sorted(f.promotions.items()):
            promoted.add_metric([pool, src, dst], float(n))
        yield from (length, slots, drain, dispatched, shed, promoted)


def register_flow_metrics(flow: FlowControl, registry: CollectorRegistry) -> list[Collector]:
    """Expose ``flow``'s metrics in ``registry`` and wire its wait histogram; returns the
    collectors (unregister them at shutdown)."""
    wait = Histogram("speedgate_queue_wait_seconds",
                     "Time waited in the gateway queue by requests that waited",
                     ["pool", "band"], buckets=WAIT_BUCKETS, registry=registry)
    flow.wait_observer = lambda pool, band, s: wait.labels(pool, band).observe(s)
    refusal = Histogram("speedgate_queue_refusal_seconds",
                        "Time from a refused request's arrival at the gateway to the refusal",
                        ["pool", "band", "reason"], buckets=REFUSAL_BUCKETS, registry=registry)
    flow.refusal_observer = (
        lambda pool, band, reason, s: refusal.labels(pool, band, reason).observe(s))
    collector = _FlowCollector(flow)
    registry.register(collector)
    return [collector, wait, refusal]
