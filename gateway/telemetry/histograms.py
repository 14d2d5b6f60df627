"""Histogram buckets of the gateway's latency and token metrics, and the per-stream gap timer.

``GapTimer`` buckets a stream's inter-token gaps as they come (no allocation per event);
``BulkHistogram`` merges a whole request's timer into a Prometheus histogram at once. Bucket
boundaries: the OpenTelemetry GenAI semantic conventions' advice, extended to the minutes an LLM
request can take and, for per-token times, down to the millisecond of a speculative fast tier.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence
from itertools import accumulate

from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

# Seconds. Semconv advice for TTFT ends at 10 s; prefill of a long agent context can take
# minutes (the default ttft timeout is 300 s).
TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip
# Seconds per token. Semconv advice starts at 10 ms; a speculative-decoding tier goes below.
TPOT_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
    0.5, 0.75, 1.0, 2.5,
)  # fmt: skip
# Seconds. Semconv advice (doubling from 10 ms to 82 s) continued to ~44 min.
DURATION_BUCKETS: tuple[float, ...] = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96,
    81.92, 163.84, 327.68, 655.36, 1310.72, 2621.44,
)  # fmt: skip
# Seconds between two content events of a stream.
ITL_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
_ZERO_GAP = bisect_left(ITL_BUCKETS, 0.0)  # the bucket of a gap of 0 s (events of one read)
# Seconds from arrival to the first upstream attempt (body read, parse, plan, routing).
QUEUE_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
# Measured / estimated upstream time of auto requests (1 = the estimate was exact).
RATIO_BUCKETS: tuple[float, ...] = (0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0)
# Tokens: the semconv advice for gen_ai.client.token.usage (powers of 4).
TOKEN_BUCKETS: tuple[float, ...] = tuple(float(4**i) for i in range(14))

class GapTimer:
    """Gaps between consecutive content events of one stream, bucketed as they come.

    ``tick(now)`` per event (monotonic seconds; ~0.2 µs, no allocation); the request's
    ``RequestRecord.itl`` holds it and ``GatewayMetrics.record_request`` merges it into the ITL
    histogram in one step. ``span_s`` (last event − first event) is the decode time.
    """

    __slots__ = ("counts", "first", "last", "n", "sum_s")

    def __init__(self) -> None:
        self.counts = [0] * (len(ITL_BUCKETS) + 1)
        self.sum_s = 0.0
        self.n = 0
        self.first: float | None = None
        self.last: float | None = None

    def tick(self, now: float) -> None:
        """One content event relayed at ``now``."""
        last = self.last
        self.last = now
        if last is None:
            self.first = now
            return
        gap = now - last
        self.counts[bisect_left(ITL_BUCKETS, gap)] += 1
        self.sum_s += gap
        self.n += 1

    def tick_many(self, now: float, k: int) -> None:
        """``k`` content events relayed at ``now`` (the events of one upstream read): the
        same state as ``k`` calls of :meth:`tick` (``k - 1`` gaps of 0 s after the first),
        in one step (the step budget: ~0.2 µs per event of a burst saved)."""
        self.tick(now)
        if k > 1:
            self.counts[_ZERO_GAP] += k - 1
            self.n += k - 1

    @property
    def span_s(self) -> float:
        """Seconds from the first to the last event (0 before two events)."""
        if self.first is None or self.last is None:
            return 0.0
        return self.last - self.first


class _BulkChild:
    __slots__ = ("counts", "sum")

    def __init__(self, n: int) -> None:
        self.counts = [0] * n
        self.sum = 0.0

    def merge(self, timer: GapTimer) -> None:
        counts = self.counts
        for i, c in enumerate(timer.counts):
            if c:
                counts[i] += c
        self.sum += timer.sum_s


class BulkHistogram(Collector):
    """A histogram that takes a request's pre-bucketed ``GapTimer`` at once (O(buckets) per
    request instead of one observation per token). Single-threaded use (the event loop)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self.name, self.documentation = name, documentation
        self.labelnames = tuple(labelnames)
        self._les = [floatToGoString(b) for b in buckets] + ["+Inf"]
        self._children: dict[tuple[str, ...], _BulkChild] = {}
        registry.register(self)

    def labels(self, *values: str) -> _BulkChild:
        """The series of these label values (created on first use)."""
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = _BulkChild(len(self._les))
        return child

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[Metric]:
        fam = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for key, child in list(self._children.items()):
            buckets = list(zip(self._les, accumulate(child.counts), strict=True))
            fam.add_metric(list(key), buckets, child.sum)
        yield fam
