"""Fixed-size rings of time buckets: the console's "last N minutes" with bounded memory.

A ``StepRing`` holds ``ceil(window_s / step_s)`` buckets, one per ``step_s`` seconds of a
monotonic clock (bucket epoch ``floor(t / step_s)``). Writing at time ``t`` finds the slot
``epoch mod n`` and, when it still holds an older epoch, replaces its bucket with a fresh one:
O(1) per write, memory bounded by ``n`` buckets whatever the traffic. Reading returns the
``n`` most recent epochs, oldest first, with ``None`` for steps nothing was written in.

``PoolStep`` is one step of one pool's requests: counts by outcome class, TTFT and output
speed sketches (``LogSketch``), tokens and cost.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from gateway.console.sketch import RELATIVE_ACCURACY, LogSketch

T = TypeVar("T")


class StepRing(Generic[T]):
    """``n = ceil(window_s / step_s)`` buckets made by ``factory``, one per step (seconds)."""

    __slots__ = ("_epochs", "_slots", "factory", "n", "step_s")

    def __init__(self, window_s: float, step_s: float, factory: Callable[[], T]) -> None:
        if step_s <= 0 or window_s < step_s:
            raise ValueError("need 0 < step_s <= window_s")
        self.step_s = step_s
        self.n = math.ceil(window_s / step_s - 1e-9)
        self.factory = factory
        self._epochs: list[int] = [-1] * self.n
        self._slots: list[T | None] = [None] * self.n

    def epoch(self, t: float) -> int:
        """The step number of monotonic time ``t`` (s)."""
        return math.floor(t / self.step_s)

    def at(self, t: float) -> T | None:
        """The bucket of time ``t`` for writing (a fresh one when its slot held an older step);
        None when ``t`` is older than the ring's oldest step (a late write is dropped)."""
        e = self.epoch(t)
        i = e % self.n
        held = self._epochs[i]
        if held == e:
            return self._slots[i]
        if held > e:
            return None
        bucket = self.factory()
        self._epochs[i] = e
        self._slots[i] = bucket
        return bucket

    def window(self, now: float, steps: int | None = None) -> list[tuple[int, T | None]]:
        """The last ``steps`` (default all ``n``) epochs up to ``now``'s, oldest first:
        ``(epoch, bucket or None)``."""
        k = self.n if steps is None else max(1, min(self.n, steps))
        last = self.epoch(now)
        out: list[tuple[int, T | None]] = []
        for e in range(last - k + 1, last + 1):
            i = e % self.n
            out.append((e, self._slots[i] if self._epochs[i] == e else None))
        return out

    def buckets(self, now: float, steps: int | None = None) -> list[T]:
        """The buckets written in the last ``steps`` epochs (oldest first, gaps skipped)."""
        return [b for _, b in self.window(now, steps) if b is not None]


@dataclass(slots=True)
class PoolStep:
    """One step of one pool (or, for requests no pool served, one tier asked for).

    Counts: ``requests`` = ``ok`` + ``errors`` (gateway or engine failure: status ≥ 500, or a
    stream that broke after it started) + ``client_errors`` (4xx but 499) + ``disconnects``
    (499, the client went away). ``ttft``: seconds, streams with a first content event;
    ``tps``: output tokens per second per successful stream, (completion − 1) / (last − first
    content event); tokens as the engine reported them (``cached`` is part of ``prompt``);
    ``cost_usd``: USD at the pool's prices."""

    requests: int = 0
    ok: int = 0
    errors: int = 0
    client_errors: int = 0
    disconnects: int = 0
    ttft: LogSketch = field(default_factory=lambda: LogSketch(RELATIVE_ACCURACY))
    tps: LogSketch = field(default_factory=lambda: LogSketch(RELATIVE_ACCURACY))
    with_usage: int = 0  # requests whose tokens are counted below
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0

    def add_outcome(self, outcome: str) -> None:
        """Count one request of class ``ok``, ``error``, ``client_error`` or ``disconnect``."""
        self.requests += 1
        if outcome == "ok":
            self.ok += 1
        elif outcome == "client_error":
            self.client_errors += 1
        elif outcome == "disconnect":
            self.disconnects += 1
        else:
            self.errors += 1

    def merge(self, other: PoolStep) -> None:
        """Add ``other``'s counts and samples to this step (reading a window)."""
        self.requests += other.requests
        self.ok += other.ok
        self.errors += other.errors
        self.client_errors += other.client_errors
        self.disconnects += other.disconnects
        self.ttft.merge(other.ttft)
        self.tps.merge(other.tps)
        self.with_usage += other.with_usage
        self.prompt_tokens += other.prompt_tokens
        self.cached_tokens += other.cached_tokens
        self.completion_tokens += other.completion_tokens
        self.cost_usd += other.cost_usd


def outcome_class(status: int, outcome: str | None) -> str:
    """``ok``, ``client_error`` (4xx except 499), ``disconnect`` (499) or ``error``."""
    if outcome == "ok":
        return "ok"
    if status == 499:
        return "disconnect"
    if 400 <= status < 500:
        return "client_error"
    return "error"
