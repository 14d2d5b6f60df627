"""A circuit breaker for calls to shared state (Redis): after ``failures`` errors in a row the
circuit opens for ``cooldown_s`` seconds (calls are skipped, the caller uses local state), then
one trial call is let through (half-open); a success closes it. Clock injected for tests.

Shared by every Redis user (usage totals, routing state, rate limits) so that "Redis is down"
is one fact the gateway reports (``/readyz`` degraded, a metric) rather than several.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger("speedgate.breaker")


class CircuitBreaker:
    """``allow()`` before a call (False: skip it); then ``success()`` or ``failure(exc)``.

    ``is_open`` is True while calls are being skipped. Log lines are rate-limited: the first
    failure, every 100th, and each open/close transition.
    """

    def __init__(
        self,
        name: str,
        failures: int = 3,
        cooldown_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.failures_to_open = failures
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._failures = 0
        self._open_until = 0.0
        self.opened = 0  # times the circuit opened, for metrics
        self.skipped = 0  # calls skipped while open

    @property
    def is_open(self) -> bool:
        """True while the circuit skips calls (Redis considered down)."""
        return self._failures >= self.failures_to_open and self._clock() < self._open_until

    @property
    def degraded(self) -> bool:
        """True from the moment the circuit opens until a call succeeds again."""
        return self._failures >= self.failures_to_open

    def allow(self) -> bool:
        """Whether to attempt the call now (closed, or half-open after the cooldown)."""
        if self.is_open:
            self.skipped += 1
            return False
        return True

    def success(self) -> None:
        """The call succeeded: close the circuit."""
        if self._failures >= self.failures_to_open:
            log.warning("%s: Redis reachable again, circuit closed", self.name)
        self._failures = 0

    def failure(self, exc: BaseException | None = None) -> None:
        """The call failed (timeout, connection error): count it, maybe open the circuit."""
        self._failures += 1
        if self._failures == 1 or self._failures % 100 == 0:
            log.warning("%s: Redis call failed (%d in a row): %r", self.name, self._failures, exc)
        if self._failures >= self.failures_to_open:
            if self._failures == self.failures_to_open:
                self.opened += 1
                log.warning("%s: circuit open for %.1fs", self.name, self.cooldown_s)
            self._open_until = self._clock() + self.cooldown_s
