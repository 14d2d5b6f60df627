"""The retry decision as a table (``upstream.retry.next_attempt``): a pool's history, the
router's pick, now and the deadline in; ask a replica (after a wait, spending the budget or
not) or stop, with a typed reason, out. No I/O, no event loop."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from gateway.config import PoolConfig, RetryConfig
from gateway.fleet.pools import Pool, Replica
from gateway.upstream.attempt import STREAM_4XX
from gateway.upstream.retry import (
    Go,
    PoolHistory,
    RetryCause,
    Stop,
    StopReason,
    full_jitter_backoff_s,
    next_attempt,
)

RETRY = RetryConfig(max_attempts=3, backoff_base_s=0.1, backoff_max_s=1.0, max_retry_after_s=1.0)
SEED = 7
JITTER_1 = full_jitter_backoff_s(1, RETRY, random.Random(SEED))  # the first retry's backoff
JITTER_2 = full_jitter_backoff_s(2, RETRY, random.Random(SEED))


def _pool() -> Pool:
    cfg = PoolConfig(endpoints=["http://10.0.0.1:8000", "http://10.0.0.2:8000"],
                     served_model_name="m", retry=RETRY)
    p = Pool("m", "standard", cfg)
    p.replicas = [Replica(u, p.key, name=f"{p.key}/{i}") for i, u in enumerate(cfg.endpoint_urls())]
    return p


@dataclass(frozen=True)
class Case:
    """``tried``/``picked``: replica indexes (None: the router found none); ``down``: replicas
    failing their health probes; ``want``: ``("go", replica, wait_s, spends_budget)`` or
    ``("stop", reason)``."""

    tried: tuple[int, ...]
    picked: int | None
    want: tuple
    last_reason: str | None = None
    retry_after_s: float | None = None
    now: float = 100.0
    deadline: float = 130.0
    down: tuple[int, ...] = ()


CASES = {
    "first attempt goes at once, free": Case((), 0, ("go", 0, 0.0, False)),
    "first attempt with nothing usable": Case((), None, ("stop", StopReason.NO_USABLE_REPLICA)),
    "retry after a 5xx: backoff, budget": Case((0,), 1, ("go", 1, JITTER_1, True), "http-5xx"),
    "second retry: a longer backoff cap": Case((0, 1), 0, ("go", 0, JITTER_2, True),
                                               "ttft-timeout"),
    "refused connection costs no budget": Case((0,), 1, ("go", 1, JITTER_1, False),
                                               "connect-error"),
    "stream-4xx diagnosis costs no budget": Case((0,), 1, ("go", 1, JITTER_1, False), STREAM_4XX),
    "every replica tried": Case((0, 1), None, ("stop", StopReason.REPLICAS_EXHAUSTED),
                                "ttft-timeout"),
    "another replica ignores the last's Retry-After": Case((0,), 1, ("go", 1, 0.0, True),
                                                           "http-5xx", retry_after_s=0.5),
    "short Retry-After: wait, ask it again": Case((0, 1), None, ("go", 1, 0.5, True),
                                                  "http-5xx", retry_after_s=0.5),
    "Retry-After 0 still yields the loop": Case((0, 1), None, ("go", 1, 0.001, True),
                                                "http-5xx", retry_after_s=0.0),
    "Retry-After over max_retry_after_s": Case((0, 1), None,
                                               ("stop", StopReason.REPLICAS_EXHAUSTED),
                                               "http-5xx", retry_after_s=2.0),
    "Retry-After past the deadline": Case((0, 1), None, ("stop", StopReason.REPLICAS_EXHAUSTED),
                                          "http-5xx", retry_after_s=0.5, deadline=100.5),
    "Retry-After of a replica now down": Case((0, 1), None,
                                              ("stop", StopReason.REPLICAS_EXHAUSTED),
                                              "http-5xx", retry_after_s=0.5, down=(1,)),
    "no Retry-After honoured after a stream-4xx": Case((0, 1), None,
                                                      ("stop", StopReason.REPLICAS_EXHAUSTED),
                                                      STREAM_4XX, retry_after_s=0.5),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_next_attempt_table(case: Case) -> None:
    pool = _pool()
    for i in case.down:
        pool.replicas[i].healthy = False
    history = PoolHistory(tuple(pool.replicas[i] for i in case.tried), case.last_reason,
                          case.retry_after_s)
    picked = None if case.picked is None else pool.replicas[case.picked]
    got = next_attempt(history, pool, picked, case.now, case.deadline, random.Random(SEED))
    if case.want[0] == "stop":
        assert got == Stop(case.want[1])
    else:
        _, replica, wait_s, spends = case.want
        assert got == Go(pool.replicas[replica], pytest.approx(wait_s), spends)


def test_backoffs_of_the_table_are_real_draws() -> None:
    """The table's jitter figures are inside their caps and not zero (else a case expecting
    a backoff could not tell one from an immediate retry)."""
    assert 0 < JITTER_1 <= RETRY.backoff_base_s
    assert 0 < JITTER_2 <= 2 * RETRY.backoff_base_s


def test_retry_cause_reads_as_tier_and_reason() -> None:
    assert str(RetryCause("fast", "ttft-timeout")) == "fast:ttft-timeout"
    assert str(RetryCause("fast", StopReason.RETRY_BUDGET_EXHAUSTED)) == (
        "fast:retry-budget-exhausted")
    assert str(RetryCause(None, "tier-unavailable")) == "tier-unavailable"
