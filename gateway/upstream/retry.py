"""Retry policy: the next step of a pool's attempts (``next_attempt``: ask a replica, wait, or
stop, with typed reasons) and backoff with full jitter (the per-pool retry budget is the
fleet's: ``gateway.fleet.retry_budget``). Pure (clock injected); the I/O is ``failover``'s.

Vocabulary and semantics from Envoy (``retry_on``, retry budgets with ``budget_percent`` and a
floor like ``min_retry_concurrency``); backoff from "Exponential Backoff And Jitter" (AWS
Architecture Blog, Brooker 2015): sleep = uniform(0, min(cap, base × 2^attempt)).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum

from gateway.config import RetryConfig
from gateway.fleet.pools import Pool, Replica
from gateway.upstream.failures import Failure, traits


def full_jitter_backoff_s(
    retry_index: int, config: RetryConfig, rng: random.Random | None = None
) -> float:
    """Seconds to wait before retry number ``retry_index`` (1 = first retry)."""
    cap = min(config.backoff_max_s, config.backoff_base_s * (2 ** max(0, retry_index - 1)))
    return (rng or random).uniform(0.0, cap)


class StopReason(StrEnum):
    """Why a pool's attempts end without an answer (its part of ``rec.fallback``)."""

    NO_USABLE_REPLICA = "no-usable-replica"  # nothing to ask at the first attempt
    REPLICAS_EXHAUSTED = "replicas-exhausted"  # every usable replica tried
    RETRY_BUDGET_EXHAUSTED = "retry-budget-exhausted"  # the pool's retry budget is spent


@dataclass(frozen=True, slots=True)
class RetryCause:
    """One step of a request's failover story: ``reason`` (an attempt's failure, e.g.
    ``ttft-timeout``, or a ``StopReason``) at ``tier`` (None for the plan's own
    ``tier-unavailable``). ``str()`` is the ``tier:reason`` of ``rec.fallback`` and spans."""

    tier: str | None
    reason: str

    def __str__(self) -> str:
        return self.reason if self.tier is None else f"{self.tier}:{self.reason}"


@dataclass(frozen=True, slots=True)
class PoolHistory:
    """What this request's attempts in one pool have seen: ``tried`` replicas in order; the
    last failure's ``last_reason`` and ``last_retry_after_s`` (seconds, None when the replica
    sent no ``Retry-After``)."""

    tried: tuple[Replica, ...] = ()
    last_reason: str | None = None
    last_retry_after_s: float | None = None


@dataclass(frozen=True, slots=True)
class Go:
    """Ask ``replica`` after ``wait_s`` seconds (0: at once). ``spends_budget``: a retry the
    pool's budget must grant first (not a first attempt, a refused connection, or the one
    stream-4xx diagnosis)."""

    replica: Replica
    wait_s: float = 0.0
    spends_budget: bool = False


@dataclass(frozen=True, slots=True)
class Stop:
    """No further attempt in this pool, for ``reason``."""

    reason: StopReason


def next_attempt(
    history: PoolHistory,
    pool: Pool,
    picked: Replica | None,
    now: float,
    deadline: float,
    rng: random.Random | None = None,
) -> Go | Stop:
    """The next step of one pool's attempts (pure but for the jitter draw from ``rng``).

    ``picked``: the router's choice among the pool's usable replicas not tried yet (None when
    there is none); ``now`` and ``deadline``: loop seconds. With every replica tried, a short
    ``Retry-After`` of the last one that fits the deadline (``retry.max_retry_after_s``) is
    honoured: wait for it and ask that replica again. A retry on another replica waits a full
    jitter backoff (``full_jitter_backoff_s``) unless the last one asked for its own wait.
    """
    n = len(history.tried)
    replica, wait = picked, 0.0
    if replica is None and n > 0 and history.last_reason != Failure.STREAM_4XX:
        replica, wait = _honour_retry_after(history, pool, now, deadline)
    if replica is None:
        return Stop(StopReason.REPLICAS_EXHAUSTED if n else StopReason.NO_USABLE_REPLICA)
    if n == 0:
        return Go(replica)
    # a refused connection cost the engine nothing, the diagnosis of a stream-4xx is once per
    # request: neither spends the budget (``failures.TRAITS``)
    spends = history.last_reason is None or traits(history.last_reason).spends_budget
    if not wait and history.last_retry_after_s is None:
        # a Retry-After is that replica's alone: another replica goes at once
        wait = full_jitter_backoff_s(n, pool.config.retry, rng)
    return Go(replica, wait, spends)


def _honour_retry_after(
    history: PoolHistory, pool: Pool, now: float, deadline: float
) -> tuple[Replica | None, float]:
    """``(replica, seconds to wait)`` when the last failure carried a ``Retry-After`` no longer
    than ``retry.max_retry_after_s`` that ends before the deadline and its replica is usable
    then; else ``(None, 0)``."""
    wait = history.last_retry_after_s
    if wait is None or not history.tried:
        return None, 0.0
    if wait > pool.config.retry.max_retry_after_s or now + wait >= deadline:
        return None, 0.0
    replica = history.tried[-1]
    if replica not in pool.usable(now + wait):
        return None, 0.0
    return replica, max(wait, 0.001)
