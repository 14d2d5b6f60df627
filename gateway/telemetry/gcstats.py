"""The cyclic garbage collector: settled after start-up, and measured.

CPython frees most objects by reference counting; only reference cycles wait for the cyclic
collector, whose collections stop the event loop while they run: every open stream sees such a
pause as an inter-token stall. The gateway therefore (1) creates no reference cycle per request
(``tests/unit/telemetry/test_gcstats.py`` holds it to that), (2) moves the start-up heap
(modules, config, tokenizer tables, FastAPI routes: ~80,000 objects) out of the collector's
sight with ``gc.freeze()``, so a full
collection scans only what was created since, and (3) sets the thresholds below. The collector
is never disabled: a cycle a library creates is still reclaimed.

Thresholds (``gc.set_threshold``, CPython 3.11 semantics, ``Modules/gcmodule.c``): a young
collection runs when allocations minus deallocations of container objects exceed ``gen0``;
the middle generation after ``gen1`` young collections; a full one after ``gen2`` middle ones
*and* when the objects waiting to be scanned exceed 25 % of the long-lived heap. With no
per-request cycles, requests free what they allocate and a young collection finds nothing to
free; its cost is the young objects it scans, so the threshold trades how often against how
long. Measured in-process (``loadtests/bench_gc.py``: 20,000 requests, 32 concurrent, through the
ASGI app against the raw engine): ``GEN0`` = 10,000 gave 21 young and 1 middle
collection, 17-20 ms in all, the longest 7-10 ms (the middle one: ten young generations'
survivors); ``GEN0`` = 2,000 (CPython's default from 3.13; 700 before) gave 103 and 9, 20 ms in
all, the longest 1.8-4.4 ms. Pauses, not their sum, are what open streams feel: 2,000.
``GEN1``/``GEN2`` keep the defaults (10).

``GcStats`` counts collections per generation and the time each took (a ``gc.callbacks``
hook, ~1 µs per collection) and exports them with the process gauges on ``/metrics``.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

GEN0 = 2_000
GEN1 = 10
GEN2 = 10


class GcSettings:
    """``settle()`` after start-up: a full collection, ``gc.freeze()``, the thresholds above;
    ``restore()`` at shutdown puts back the previous thresholds and unfreezes (so an app created
    and stopped inside a test process leaves the collector as it found it)."""

    __slots__ = ("_previous",)

    def __init__(self) -> None:
        self._previous: tuple[int, int, int] | None = None

    def settle(self) -> None:
        """Collect once, freeze every surviving object, set ``(GEN0, GEN1, GEN2)``."""
        if self._previous is None:
            self._previous = gc.get_threshold()
        gc.collect()
        gc.freeze()
        gc.set_threshold(GEN0, GEN1, GEN2)

    def restore(self) -> None:
        """Undo ``settle`` (idempotent)."""
        if self._previous is not None:
            gc.set_threshold(*self._previous)
            gc.unfreeze()
            self._previous = None


class GcStats(Collector):
    """Counts of collections per generation (0, 1, 2), their total and longest pause
    (seconds, ``time.perf_counter``) and the objects they freed, from ``install()`` until
    ``uninstall()``. Exported as ``speedgate_process_gc_collections_total{generation}``,
    ``speedgate_process_gc_pause_seconds_total{generation}``,
    ``speedgate_process_gc_pause_max_seconds`` and
    ``speedgate_process_gc_collected_objects_total{generation}``."""

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.pause_s = [0.0, 0.0, 0.0]
        self.collected = [0, 0, 0]
        self.max_pause_s = 0.0
        self._t0 = 0.0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        took = time.perf_counter() - self._t0
        gen = min(int(info.get("generation", 2)), 2)
        self.collections[gen] += 1
        self.pause_s[gen] += took
        self.collected[gen] += int(info.get("collected", 0))
        if took > self.max_pause_s:
            self.max_pause_s = took

    def install(self) -> None:
        """Start counting (idempotent)."""
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def uninstall(self) -> None:
        """Stop counting (idempotent)."""
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def collect(self) -> Iterator[Metric]:
        runs = CounterMetricFamily(
            "speedgate_process_gc_collections", "cyclic GC collections", labels=["generation"]
        )
        pause = CounterMetricFamily(
            "speedgate_process_gc_pause_seconds",
            "event-loop time spent in cyclic GC collections", labels=["generation"],
        )
        freed = CounterMetricFamily(
            "speedgate_process_gc_collected_objects",
            "objects freed by cyclic GC collections (members of reference cycles)",
            labels=["generation"],
        )
        for gen in range(3):
            runs.add_metric([str(gen)], self.collections[gen])
            pause.add_metric([str(gen)], self.pause_s[gen])
            freed.add_metric([str(gen)], self.collected[gen])
        yield runs
        yield pause
        yield freed
        yield GaugeMetricFamily(
            "speedgate_process_gc_pause_max_seconds", "longest cyclic GC collection",
            value=self.max_pause_s,
        )
