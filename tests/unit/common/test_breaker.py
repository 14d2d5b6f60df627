"""Circuit breaker: opens after N failures, half-opens after the cooldown with one trial call,
closes on success."""

import asyncio

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


def test_half_open_lets_one_trial_call_through():
    """Fixed: "the circuit breaker's half-open state lets everything through": after the
    cooldown exactly one caller is let through; the others keep their fallback until the trial
    answers (a failure re-opens for a whole cooldown, a success closes)."""
    now = [0.0]
    b = CircuitBreaker("t", failures=1, cooldown_s=5, clock=lambda: now[0])
    b.failure()
    now[0] = 5.0
    assert [b.allow() for _ in range(10)] == [True] + [False] * 9
    now[0] = 5.5  # the trial is still out: everyone else keeps skipping
    assert not b.allow()
    b.failure()  # the trial failed: open for another cooldown
    now[0] = 10.4
    assert not b.allow()
    now[0] = 10.6
    assert [b.allow() for _ in range(3)] == [True, False, False]
    b.success()
    assert [b.allow() for _ in range(3)] == [True, True, True] and not b.degraded
    assert b.trials == 2


def test_a_trial_that_never_reports_is_given_up_after_its_timeout():
    now = [0.0]
    b = CircuitBreaker("t", failures=1, cooldown_s=5, clock=lambda: now[0], trial_timeout_s=1)
    b.failure()
    now[0] = 5.0
    assert b.allow() and not b.allow()  # the trial's caller is cancelled and never reports
    now[0] = 6.1
    assert b.allow() and not b.allow()  # a new trial


def test_concurrent_callers_after_the_cooldown_wait_for_one_redis_call_only():
    """The outage case: 50 requests arrive just after the cooldown while Redis still hangs;
    one of them waits the Redis timeout, 49 take the fallback at once."""
    now = [0.0]
    b = CircuitBreaker("t", failures=1, cooldown_s=5, clock=lambda: now[0])
    b.failure()
    now[0] = 5.0
    calls = []

    async def frozen_redis() -> None:
        calls.append(1)
        await asyncio.sleep(0.05)  # the Redis timeout
        raise TimeoutError

    async def request() -> str:
        if not b.allow():
            return "fallback"
        try:
            await frozen_redis()
        except TimeoutError as e:
            b.failure(e)
            return "timed-out"
        b.success()
        return "redis"

    async def main() -> list[str]:
        return await asyncio.gather(*(request() for _ in range(50)))

    out = asyncio.run(main())
    assert len(calls) == 1 and out.count("timed-out") == 1 and out.count("fallback") == 49
