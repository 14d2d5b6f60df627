"""The queue discipline of one pool (``gateway.admit.flow.queue``): strict bands, promotion
after ``max_wait_s``, deadlines, tokens ahead. Pure: times are plain numbers."""

from __future__ import annotations

from gateway.admit.flow.queue import BandedQueue, BandRule, Waiter

BANDS = [BandRule("interactive"), BandRule("standard"), BandRule("batch", max_wait_s=60.0)]


def w(band: int, key: str = "k", t: float = 0.0, cost: float = 10, deadline: float = 1e9,
      session: str = "s") -> Waiter:
    return Waiter(key, session, cost, band, t, deadline)


def test_strict_priority_between_bands():
    q = BandedQueue(BANDS)
    batch, std, inter = w(2, t=0), w(1, t=1), w(0, t=2)
    for x in (batch, std, inter):
        q.push(x)
    assert [q.pop(), q.pop(), q.pop(), q.pop()] == [inter, std, batch, None]


def test_pop_takes_only_bands_allowed_a_slot():
    q = BandedQueue(BANDS)
    batch = w(2)
    q.push(batch)
    assert q.pop(lowest=1) is None  # batch may not use the slot reserved for higher bands
    assert q.pop(lowest=2) is batch


def test_starvation_guard_promotes_after_max_wait_s():
    q = BandedQueue(BANDS)
    old_batch = w(2, key="b", t=0.0)
    q.push(old_batch)
    std = w(1, key="s", t=30.0)
    q.push(std)
    assert q.promote(59.9) == []
    assert q.promote(60.0) == [(old_batch, 2, 1)]
    assert old_batch.band == 1 and old_batch.first_band == 2
    # the promoted request goes ahead of the band's own waiting requests...
    inter = w(0, t=61.0)
    q.push(inter)
    assert [q.pop(), q.pop(), q.pop()] == [inter, old_batch, std]  # ...but not of a higher band


def test_deadlines_expire_only_queued_requests():
    q = BandedQueue(BANDS)
    a, b, c = w(1, deadline=5.0), w(1, deadline=7.0), w(2, deadline=5.0)
    for x in (a, b, c):
        q.push(x)
    assert q.pop() is a  # dispatched: its deadline no longer applies
    assert q.expired(4.9) == []
    assert q.expired(5.0) == [c]
    assert len(q) == 1 and b in q


def test_remove_from_any_place():
    q = BandedQueue(BANDS)
    a = w(2, t=0.0)
    q.push(a)
    q.promote(100.0)
    assert q.remove(a) and not q.remove(a)
    assert len(q) == 0 and q.lengths() == [0, 0, 0]


def test_tokens_ahead_is_the_fluid_fair_share():
    q = BandedQueue(BANDS)
    q.push(w(0, key="i", cost=50))
    for _ in range(10):
        q.push(w(1, key="flood", cost=100))  # 1000 tokens queued
    q.push(w(1, key="light", cost=100))
    # a new standard request of the light key waits for the interactive 50, its own 100 and,
    # of the flood's 1000, only what fair sharing serves before it: 200 (equal weights)
    assert q.tokens_ahead(1, "light", 100, 1.0) == 50 + 100 + 200
    # a flood request waits for all its own and the light key's
    assert q.tokens_ahead(1, "flood", 100, 1.0) == 50 + 1000 + 100
    # a batch request waits for everything above it
    assert q.tokens_ahead(2, "x", 10, 1.0) == 50 + 1100
