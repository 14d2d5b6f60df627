"""Rings of time buckets with an injected clock: what a window holds, when steps expire, and
that memory stays bounded."""

from __future__ import annotations

import pytest

from gateway.console.window import PoolStep, StepRing, outcome_class


def test_writes_land_in_their_step_and_expire_after_the_window() -> None:
    ring: StepRing[list[float]] = StepRing(30.0, 10.0, list)  # 3 buckets of 10 s
    assert ring.n == 3
    for t in (100.0, 105.0, 112.0, 125.0):
        b = ring.at(t)
        assert b is not None
        b.append(t)
    assert ring.window(129.0) == [(10, [100.0, 105.0]), (11, [112.0]), (12, [125.0])]
    # at t = 131 step 10 has left the window; step 13 is empty
    assert ring.window(131.0) == [(11, [112.0]), (12, [125.0]), (13, None)]
    assert ring.buckets(131.0) == [[112.0], [125.0]]
    assert ring.buckets(131.0, steps=1) == []
    # writing step 13 reuses the slot of step 10: a fresh bucket, not the old one
    b = ring.at(131.0)
    assert b == [] and ring.window(131.0)[-1] == (13, [])


def test_late_writes_older_than_the_ring_are_dropped() -> None:
    ring: StepRing[list[float]] = StepRing(20.0, 10.0, list)
    ring.at(100.0).append(1)  # type: ignore[union-attr]
    ring.at(120.0).append(2)  # type: ignore[union-attr]  # takes step 10's slot
    assert ring.at(101.0) is None  # step 10 is gone
    assert ring.buckets(120.0) == [[2]]


def test_memory_is_bounded_by_the_number_of_steps() -> None:
    ring: StepRing[PoolStep] = StepRing(300.0, 5.0, PoolStep)
    for i in range(100_000):
        step = ring.at(i * 0.05)  # 20 requests a second for 5,000 s
        assert step is not None
        step.add_outcome("ok")
        step.ttft.add(0.05 + (i % 100) / 1000)
    assert len({id(b) for b in ring._slots if b is not None}) == ring.n == 60
    total = sum(b.requests for b in ring.buckets(100_000 * 0.05 - 0.05))
    assert total == 60 * 100  # the window holds exactly its 60 steps of 100 requests


def test_step_merge_and_outcome_classes() -> None:
    a, b = PoolStep(), PoolStep()
    for cls in ("ok", "ok", "error", "client_error", "disconnect"):
        a.add_outcome(cls)
    b.add_outcome("ok")
    b.ttft.add(0.2)
    b.prompt_tokens, b.cached_tokens, b.cost_usd = 10, 4, 0.5
    a.merge(b)
    assert (a.requests, a.ok, a.errors, a.client_errors, a.disconnects) == (6, 3, 1, 1, 1)
    assert (a.ttft.count, a.prompt_tokens, a.cached_tokens, a.cost_usd) == (1, 10, 4, 0.5)
    assert outcome_class(200, "ok") == "ok"
    assert outcome_class(200, "upstream_error") == "error"  # a stream that broke mid-way
    assert outcome_class(499, "client_disconnected") == "disconnect"
    assert outcome_class(429, "rate_limit_exceeded") == "client_error"
    assert outcome_class(503, "no_healthy_replica") == "error"


def test_bad_ring_sizes_are_refused() -> None:
    with pytest.raises(ValueError):
        StepRing(5.0, 10.0, list)
    with pytest.raises(ValueError):
        StepRing(5.0, 0.0, list)
