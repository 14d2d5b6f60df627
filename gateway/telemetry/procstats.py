"""Process gauges for leak checks: asyncio tasks, threads, resident memory (scrape time).

``speedgate_process_asyncio_tasks`` and ``speedgate_process_threads`` must return to their
baseline after load (case stream-memory: no per-chunk task or thread survives a request);
``speedgate_process_resident_memory_bytes`` is read from ``/proc/self/statm`` on Linux.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int | None:
    """Resident set size in bytes, or None where ``/proc`` is not available."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


class ProcessCollector(Collector):
    """Gauges read when ``/metrics`` is scraped; ``loop`` is the gateway's event loop (the
    scrape renders in a worker thread; ``asyncio.all_tasks`` retries a concurrent change)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def collect(self) -> Iterator[Metric]:
        tasks = len(asyncio.all_tasks(self.loop))
        yield GaugeMetricFamily(
            "speedgate_process_asyncio_tasks", "asyncio tasks alive in the gateway", value=tasks
        )
        yield GaugeMetricFamily(
            "speedgate_process_threads", "threads alive in the gateway",
            value=threading.active_count(),
        )
        info = GaugeMetricFamily(
            "speedgate_process_info", "this process (one per server.workers worker): its pid",
            labels=["pid"],
        )
        info.add_metric([str(os.getpid())], 1)
        yield info
        rss = resident_bytes()
        if rss is not None:
            yield GaugeMetricFamily(
                "speedgate_process_resident_memory_bytes", "resident set size", value=rss
            )
