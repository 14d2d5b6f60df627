"""A small relative-error quantile sketch (DDSketch) for the console's live percentiles.

DDSketch (Masson, Rim, Lee, "DDSketch: A Fast and Fully-Mergeable Quantile Sketch with
Relative-Error Guarantees", VLDB 2019): a positive value ``x`` goes to bucket
``k = ceil(log_γ x)`` with ``γ = (1 + α) / (1 − α)``; a bucket stands for the value
``2γᵏ / (γ + 1)``, which is within a relative ``α`` of every value the bucket holds, so every
quantile read from the sketch is within ``α`` (relative) of a true sample at that rank. Adding a
value is O(1); merging is a sum of bucket counts (how a time window is read from its step
buckets). Memory: one dict entry per distinct bucket, at most ``ln(max/min) / ln γ`` (about
460 for 1 ms … 100 s at α = 1 %), in practice a few dozen.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

#: Relative accuracy of every quantile (DDSketch's default, 1 %).
RELATIVE_ACCURACY = 0.01
#: Values at or below this count as zero (they have no logarithm); same unit as the values.
MIN_POSITIVE = 1e-9


class LogSketch:
    """Counts of positive values in logarithmic buckets; ``quantile(q)`` within ``α`` relative.

    ``count``: values added; ``total``: their sum (for the mean). Values ≤ ``MIN_POSITIVE``
    (and NaN) go to ``zeros``; infinities are ignored."""

    __slots__ = ("_inv_log_gamma", "buckets", "count", "gamma", "total", "zeros")

    def __init__(self, relative_accuracy: float = RELATIVE_ACCURACY) -> None:
        if not 0.0 < relative_accuracy < 1.0:
            raise ValueError("relative_accuracy must be in (0, 1)")
        self.gamma = (1.0 + relative_accuracy) / (1.0 - relative_accuracy)
        self._inv_log_gamma = 1.0 / math.log(self.gamma)
        self.buckets: dict[int, int] = {}
        self.zeros = 0
        self.count = 0
        self.total = 0.0

    def add(self, x: float) -> None:
        """Add one value (O(1))."""
        if math.isinf(x):
            return
        self.count += 1
        if not x > MIN_POSITIVE:  # also NaN
            self.zeros += 1
            return
        self.total += x
        k = math.ceil(math.log(x) * self._inv_log_gamma)
        self.buckets[k] = self.buckets.get(k, 0) + 1

    def merge(self, other: LogSketch) -> None:
        """Add every value of ``other`` (same accuracy) to this sketch."""
        if other.gamma != self.gamma:
            raise ValueError("cannot merge sketches of different accuracy")
        for k, n in other.buckets.items():
            self.buckets[k] = self.buckets.get(k, 0) + n
        self.zeros += other.zeros
        self.count += other.count
        self.total += other.total

    def clear(self) -> None:
        """Forget every value."""
        self.buckets.clear()
        self.zeros = self.count = 0
        self.total = 0.0

    def quantile(self, q: float) -> float | None:
        """The value at quantile ``q`` in [0, 1] (rank ``q × (count − 1)``, the lower value,
        as DDSketch defines it); None when empty."""
        if self.count == 0:
            return None
        rank = min(max(q, 0.0), 1.0) * (self.count - 1)
        seen = self.zeros
        if seen > rank:
            return 0.0
        for k in sorted(self.buckets):
            seen += self.buckets[k]
            if seen > rank:
                return 2.0 * self.gamma**k / (self.gamma + 1.0)
        return 2.0 * self.gamma ** max(self.buckets) / (self.gamma + 1.0)  # float edge

    def mean(self) -> float | None:
        """Mean of the values added (zeros included); None when empty."""
        return self.total / self.count if self.count else None

    @classmethod
    def merged(cls, sketches: Iterable[LogSketch], relative_accuracy: float) -> LogSketch:
        """A new sketch holding the values of all ``sketches``."""
        out = cls(relative_accuracy)
        for s in sketches:
            out.merge(s)
        return out
