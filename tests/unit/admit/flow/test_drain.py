"""Drain rate and early shedding (``gateway.admit.flow.drain``), with explicit times."""

from __future__ import annotations

import pytest

from gateway.admit.flow.drain import DrainMeter, expected_wait_s, retry_after_s, shed


def test_rate_is_tokens_per_second_of_backlog():
    m = DrainMeter(half_life_s=1e9)
    m.mark(0.0, True)
    for i in range(1, 101):  # 100 tokens every 0.1 s while requests wait: 1000 tokens/s
        m.dispatched(i * 0.1, 100, backlogged_after=True)
    assert m.rate() == pytest.approx(1000.0)


def test_idle_time_does_not_count():
    m = DrainMeter(half_life_s=1e9)
    m.mark(0.0, True)
    for i in range(1, 11):
        m.dispatched(i * 0.1, 100, backlogged_after=i < 10)  # queue empties at t = 1
    m.mark(50.0, False)  # 49 s with nothing waiting
    m.mark(50.0, True)
    for i in range(1, 11):
        m.dispatched(50 + i * 0.1, 100, backlogged_after=True)
    assert m.rate() == pytest.approx(1000.0)


def test_rate_follows_the_pool_with_a_half_life():
    m = DrainMeter(half_life_s=2.0)
    m.mark(0.0, True)
    t = 0.0
    for _ in range(100):  # 1000 tokens/s
        t += 0.1
        m.dispatched(t, 100, True)
    for _ in range(200):  # then the pool halves: 500 tokens/s for 20 s (10 half-lives)
        t += 0.1
        m.dispatched(t, 50, True)
    assert m.rate() == pytest.approx(500.0, rel=0.01)


def test_unknown_until_measured():
    m = DrainMeter(half_life_s=10.0)
    assert m.rate() is None
    m.mark(0.0, True)
    m.dispatched(0.1, 100, True)
    assert m.rate() is None  # one sample, 0.1 s: not enough


def test_expected_wait_takes_the_slower_of_pool_and_key():
    assert expected_wait_s(12_000, 1000.0) == pytest.approx(12.0)
    # a backlogged key draining at a quarter of the pool waits for its own queue at its rate
    assert expected_wait_s(2_000, 1000.0, own_tokens=5_000, key_rate=250.0) == pytest.approx(20)
    assert expected_wait_s(2_000, None, own_tokens=500, key_rate=250.0) == pytest.approx(2.0)
    assert expected_wait_s(2_000, None) is None


def test_shed_when_the_expected_wait_exceeds_the_budget():
    d = shed(expected_wait_s(12_000, 1000.0), budget_s=10.0, queued=5, max_queue_len=100)
    assert d.reason == "expected_wait"
    assert d.expected_wait_s == pytest.approx(12.0)
    assert d.retry_after_s == pytest.approx(2.0)  # when the backlog ahead will fit the budget
    ok = shed(expected_wait_s(8_000, 1000.0), budget_s=10.0, queued=5, max_queue_len=100)
    assert ok.reason is None and ok.expected_wait_s == pytest.approx(8.0)


def test_shed_when_full_or_unknown_rate():
    assert shed(None, 1.0, queued=100, max_queue_len=100).reason == "queue_full"
    d = shed(None, 1.0, queued=0, max_queue_len=100)
    assert d.reason is None and d.expected_wait_s is None  # no measurement: wait (bounded)
    assert shed(0.005, 1.0, 0, 100).retry_after_s == 1.0


def test_retry_after_after_waiting():
    assert retry_after_s(30.0) == pytest.approx(30.0)
    assert retry_after_s(0.01) == 1.0
    assert retry_after_s(None) == 1.0
