"""The DDSketch quantiles the console reads its live percentiles from: within the relative
accuracy of the true sample at the same rank, mergeable, bounded."""

from __future__ import annotations

import math
import random

import pytest

from gateway.console.sketch import RELATIVE_ACCURACY, LogSketch


def _exact(values: list[float], q: float) -> float:
    """The sample at rank floor(q × (n − 1)) (DDSketch's lower quantile)."""
    ordered = sorted(values)
    return ordered[math.floor(q * (len(ordered) - 1))]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_quantiles_within_relative_accuracy_over_six_decades(seed: int) -> None:
    rng = random.Random(seed)
    values = [10 ** rng.uniform(-4, 2) for _ in range(5000)]  # 0.1 ms … 100 s
    s = LogSketch()
    for v in values:
        s.add(v)
    for q in (0.0, 0.05, 0.5, 0.9, 0.95, 0.99, 1.0):
        got, want = s.quantile(q), _exact(values, q)
        assert got is not None
        assert abs(got - want) <= RELATIVE_ACCURACY * want * (1 + 1e-9), (q, got, want)
    assert s.count == 5000
    assert s.mean() == pytest.approx(sum(values) / len(values))
    # bounded: one entry per distinct log bucket, ln(1e6) / ln(γ) ≈ 691 at most
    assert len(s.buckets) <= math.ceil(math.log(1e6) / math.log(s.gamma)) + 1


def test_merge_equals_adding_everything() -> None:
    rng = random.Random(7)
    a, b, both = LogSketch(), LogSketch(), LogSketch()
    for i in range(2000):
        v = rng.expovariate(10.0)
        (a if i % 3 else b).add(v)
        both.add(v)
    merged = LogSketch.merged([a, b], RELATIVE_ACCURACY)
    assert merged.buckets == both.buckets and merged.count == both.count
    for q in (0.5, 0.95):
        assert merged.quantile(q) == both.quantile(q)


def test_empty_zero_and_odd_values() -> None:
    s = LogSketch()
    assert s.quantile(0.5) is None and s.mean() is None
    s.add(0.0)
    s.add(float("nan"))
    s.add(float("inf"))  # ignored
    s.add(2.0)
    assert s.count == 3 and s.zeros == 2
    assert s.quantile(0.0) == 0.0
    assert s.quantile(1.0) == pytest.approx(2.0, rel=RELATIVE_ACCURACY)
    s.clear()
    assert s.count == 0 and s.quantile(0.5) is None


def test_a_single_value_comes_back_within_accuracy() -> None:
    for v in (0.0123, 1.0, 57.3, 1234.5):
        s = LogSketch()
        s.add(v)
        assert s.quantile(0.5) == pytest.approx(v, rel=RELATIVE_ACCURACY)


def test_sketches_of_different_accuracy_do_not_merge() -> None:
    with pytest.raises(ValueError):
        LogSketch(0.01).merge(LogSketch(0.02))
    with pytest.raises(ValueError):
        LogSketch(0.0)
