"""The drain rate of one pool's queue and what it says about waiting: early shedding with an
honest ``Retry-After``. Pure: every method takes ``now`` (seconds, any monotonic clock).

``DrainMeter`` measures how fast the queue empties while it is backlogged: estimated tokens
dispatched from the queue per second of backlog, both sums exponentially decayed with
half-life ``half_life_s`` so the rate follows the pool (replicas added or lost, requests
changing shape). Time with an empty queue is not counted: the rate is the pool's capacity to
drain, not its recent demand. ``shed`` turns a request's tokens ahead into its expected wait
(tokens ahead / rate) and refuses it at arrival when that exceeds its budget, with
``Retry-After`` = the expected wait minus the budget (when the backlog ahead will have drained
enough for it to fit), at least 1 s.
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


def shed(
    tokens_ahead: float,
    rate: float | None,
    budget_s: float,
    queued: int,
    max_queue_len: int,
) -> ShedDecision:
    """Decide at arrival whether a request that must wait can start within ``budget_s``
    seconds (the lesser of its band's ``max_queue_s`` and its own deadline).

    ``tokens_ahead``: estimated tokens dispatched before it (``BandedQueue.tokens_ahead``);
    ``rate``: the drain rate (tokens/s, None: unknown, then only the queue length refuses);
    ``queued``: requests waiting in the pool's queue now."""
    wait = tokens_ahead / rate if rate else None
    if queued >= max_queue_len:
        return ShedDecision("queue_full", wait, max(1.0, wait or 1.0))
    if wait is not None and wait > budget_s:
        return ShedDecision("expected_wait", wait, max(1.0, wait - budget_s))
    return ShedDecision(None, wait)


def retry_after_s(tokens_ahead: float, rate: float | None) -> float:
    """``Retry-After`` (s) for a request refused after waiting: the time the backlog ahead of a
    new request of its band needs to drain, at least 1 s (1 s when the rate is unknown)."""
    return max(1.0, tokens_ahead / rate) if rate else 1.0
