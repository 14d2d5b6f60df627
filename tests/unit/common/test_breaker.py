"""Circuit breaker: opens after N failures, half-opens after the cooldown, closes on success."""

from gateway.common.breaker import CircuitBreaker


def test_open_half_open_close():
    now = [0.0]
    b = CircuitBreaker("t", failures=2, cooldown_s=5, clock=lambda: now[0])
    assert b.allow()
    b.failure()
    assert b.allow() and not b.degraded
    b.failure()
    assert b.is_open and b.degraded and not b.allow() and b.skipped == 1
    now[0] = 5.1
    assert b.allow()  # half-open: one trial
    b.failure()
    assert not b.allow()  # trial failed: open again
    now[0] = 11.0
    assert b.allow()
    b.success()
    assert not b.degraded and b.allow() and b.opened == 1
