"""The drain rate of one pool's queue and what it says about waiting: early shedding with an
honest ``Retry-After``. Pure: every method takes ``now`` (seconds, any monotonic clock).

``DrainMeter`` measures how fast the queue empties while it is backlogged: estimated tokens
dispatched from the queue per second of backlog, both sums exponentially decayed with
half-life ``half_life_s`` so the rate follows the pool (replicas added or lost, requests
changing shape). Time with an empty queue is not counted: the rate is the pool's capacity to
drain, not its recent demand. One meter per pool, and one per API key counting only that key's
requests and the time it had some waiting: under fair queuing a backlogged key drains at its
share, not at the pool's rate.

``expected_wait_s`` is the larger of two estimates: the tokens ahead of the request (fluid fair
sharing, ``queue.BandedQueue.tokens_ahead``) over the pool's rate, and, when its key already
has requests waiting, the key's own queued tokens over the key's measured rate (a flooding key
that gets a quarter of the pool waits four times longer than the pool's rate says). ``shed``
refuses a request at arrival when that exceeds its budget, with ``Retry-After`` = the expected
wait minus the budget (when the backlog ahead will have drained enough for it to fit), at
least 1 s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


class DrainMeter:
    """Estimated tokens dispatched per second of backlog (decayed). ``mark`` at every queue
    event (arrival, dispatch, removal) with whether requests were waiting since the previous
    event; ``dispatched`` for each request leaving the queue for an engine."""

    def __init__(self, half_life_s: float, min_busy_s: float = 0.1, min_samples: int = 5) -> None:
        self.half_life_s = half_life_s
        self.min_busy_s = min_busy_s
        self.min_samples = min_samples
        self.tokens = 0.0  # decayed tokens dispatched while backlogged
        self.busy_s = 0.0  # decayed seconds with requests waiting
        self.samples = 0
        self._last: float | None = None
        self._backlogged = False

    def mark(self, now: float, backlogged: bool) -> None:
        """Advance to ``now``: the time since the previous mark counts as backlog when the
        queue had requests then; ``backlogged`` is whether it has some from now on."""
        if self._last is not None and now > self._last:
            dt = now - self._last
            decay = math.exp(-math.log(2) * dt / self.half_life_s)
            self.tokens *= decay
            self.busy_s *= decay
            if self._backlogged:
                self.busy_s += dt
        if self._last is None or now >= self._last:
            self._last = now
        self._backlogged = backlogged

    def dispatched(self, now: float, cost: float, backlogged_after: bool) -> None:
        """A request of ``cost`` estimated tokens left the queue for an engine at ``now``."""
        self.mark(now, True)
        self.tokens += cost
        self.samples += 1
        self._backlogged = backlogged_after

    def rate(self) -> float | None:
        """Tokens per second of backlog, or None until enough has been measured."""
        if self.samples < self.min_samples or self.busy_s < self.min_busy_s or self.tokens <= 0:
            return None
        return self.tokens / self.busy_s


@dataclass(frozen=True, slots=True)
class ShedDecision:
    """``reason`` None: queue the request (``expected_wait_s`` None when the rate is not known
    yet). Else refuse it now: ``queue_full`` or ``expected_wait``, with ``retry_after_s``."""

    reason: str | None
    expected_wait_s: float | None
    retry_after_s: float = 1.0


def expected_wait_s(
    tokens_ahead: float,
    rate: float | None,
    own_tokens: float = 0.0,
    key_rate: float | None = None,
) -> float | None:
    """Seconds until a new request starts: ``max(tokens_ahead / rate, own_tokens / key_rate)``
    over the estimates available (None when neither rate is known). ``own_tokens``: its key's
    tokens already waiting in its band; ``key_rate``: the key's drain rate while it
    had requests waiting (None when it has none waiting or no measurement)."""
    waits = [tokens_ahead / rate if rate else None, own_tokens / key_rate if key_rate else None]
    known = [w for w in waits if w is not None]
    return max(known) if known else None


def shed(
    wait: float | None,
    budget_s: float,
    queued: int,
    max_queue_len: int,
) -> ShedDecision:
    """Decide at arrival whether a request that must wait can start within ``budget_s``
    seconds (its band's ``max_queue_s`` and its deadline less its expected service time).

    ``wait``: its expected wait (``expected_wait_s``; None: unknown, then only the queue length
    refuses); ``queued``: requests waiting in the pool's queue now."""
    if queued >= max_queue_len:
        return ShedDecision("queue_full", wait, max(1.0, wait or 1.0))
    if wait is not None and wait > budget_s:
        return ShedDecision("expected_wait", wait, max(1.0, wait - budget_s))
    return ShedDecision(None, wait)


def retry_after_s(wait: float | None) -> float:
    """``Retry-After`` (s) for a request refused after waiting: the expected wait of a new
    request like it (``expected_wait_s``), at least 1 s (1 s when unknown)."""
    return max(1.0, wait) if wait else 1.0
