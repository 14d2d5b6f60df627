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
free; it runs when the objects alive *in flight* cross ``gen0``, and costs about the young
objects it scans. In a served gateway the in-flight population is large (64 concurrent
requests, their connections and uvicorn/aiohttp objects: several thousand containers), so a
low threshold is crossed over and over: ``loadtests/bench_capacity_core.py`` (uvicorn, c up to
64) saw, with ``GEN0`` = 2,000 (CPython's default from 3.13; 700 before), 401 young, 37 middle
and 3 full collections over its non-streaming cells, 571 ms of pauses, the longest 17 ms (a
full one: every object created since the freeze); with ``GEN0`` = 10,000, one young collection
(2.2 ms) in the whole run. The in-process burst (``loadtests/bench_gc.py``, no server objects)
shows the other side: 10,000 makes each middle collection longer (7-10 ms against 2-4 ms), as
it scans ten young generations' survivors; they come once per ~20,000 requests there.
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

GEN0 = 10_000
GEN1 = 10
GEN2 = 10


class GcSettings:
    """``settle()`` after start-up: a full collection, ``gc.freeze()``, the thresholds above;
    ``restore()`` at shutdown puts back the thresholds found before and unfreezes, once the
    last settled app of the process stops (several apps started in one test process leave the
    collector as the first found it)."""

    __slots__ = ("_settled",)
    _active = 0  # apps of this process settled and not yet restored
    _previous: tuple[int, int, int] = (700, 10, 10)

    def __init__(self) -> None:
        self._settled = False

    def settle(self) -> None:
        """Collect once, freeze every surviving object, set ``(GEN0, GEN1, GEN2)``."""
        if self._settled:
            return
        if GcSettings._active == 0:
            GcSettings._previous = gc.get_threshold()
        GcSettings._active += 1
        self._settled = True
        gc.collect()
        gc.freeze()
        gc.set_threshold(GEN0, GEN1, GEN2)

    def restore(self) -> None:
        """Undo ``settle`` (idempotent); the last one restores the collector."""
        if not self._settled:
            return
        self._settled = False
        GcSettings._active -= 1
        if GcSettings._active == 0:
            gc.set_threshold(*GcSettings._previous)
            gc.unfreeze()


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
