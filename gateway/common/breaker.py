"""A circuit breaker for calls to shared state (Redis): after ``failures`` errors in a row the
circuit opens for ``cooldown_s`` seconds (calls are skipped, the caller uses local state), then
it is half-open: exactly one trial call goes through while every other caller keeps skipping
(its fallback) until the trial answers; a success closes the circuit, a failure opens it for
another cooldown. A trial whose caller never reports (cancelled) is given up after
``trial_timeout_s`` (default: the cooldown) and the next caller becomes the trial. This is the
half-open state of Nygard's "Release It!" and of resilience4j's
``permittedNumberOfCallsInHalfOpenState`` (here 1): letting every caller through at the end of
each cooldown makes all requests arriving then wait the Redis timeout together. Clock injected
for tests; times in seconds.

One breaker per Redis connection (``gateway.common.redis_conn``), shared by every Redis user
(usage totals, routing state, rate limits), so that "Redis is down" is one fact the gateway
reports (``/readyz`` degraded, a metric) rather than several.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger("speedgate.breaker")


class CircuitBreaker:
    """``allow()`` before a call (False: skip it); then ``success()`` or ``failure(exc)``.

    ``is_open`` is True while calls are being skipped for the cooldown; ``degraded`` from the
    moment the circuit opens until a call succeeds. Log lines are rate-limited: the first
    failure, every 100th, and each open/close transition.
    """

    def __init__(
        self,
        name: str,
        failures: int = 3,
        cooldown_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        trial_timeout_s: float | None = None,
    ) -> None:
        self.name = name
        self.failures_to_open = failures
        self.cooldown_s = cooldown_s
        self.trial_timeout_s = cooldown_s if trial_timeout_s is None else trial_timeout_s
        self._clock = clock
        self._failures = 0
        self._open_until = 0.0
        self._trial_until = 0.0  # a half-open trial call is in flight until then
        self.opened = 0  # times the circuit opened, for metrics
        self.skipped = 0  # calls skipped while open or while a trial was in flight
        self.trials = 0  # half-open trial calls let through

    @property
    def is_open(self) -> bool:
        """True while the circuit skips calls for its cooldown (Redis considered down)."""
        return self._failures >= self.failures_to_open and self._clock() < self._open_until

    @property
    def degraded(self) -> bool:
        """True from the moment the circuit opens until a call succeeds again."""
        return self._failures >= self.failures_to_open

    def allow(self) -> bool:
        """Whether to attempt the call now: always when closed; when half-open (cooldown over)
        only for the one caller that becomes the trial (it must report ``success`` or
        ``failure``); never while open."""
        if self._failures < self.failures_to_open:
            return True
        now = self._clock()
        if now < self._open_until or now < self._trial_until:
            self.skipped += 1
            return False
        self._trial_until = now + self.trial_timeout_s
        self.trials += 1
        return True

    def success(self) -> None:
        """The call succeeded: close the circuit."""
        if self._failures >= self.failures_to_open:
            log.warning("%s: Redis reachable again, circuit closed", self.name)
        self._failures = 0
        self._trial_until = 0.0

    def failure(self, exc: BaseException | None = None) -> None:
        """The call failed (timeout, connection error): count it, maybe open the circuit (a
        failed trial opens it for another cooldown)."""
        self._failures += 1
        self._trial_until = 0.0
        if self._failures == 1 or self._failures % 100 == 0:
            log.warning("%s: Redis call failed (%d in a row): %r", self.name, self._failures, exc)
        if self._failures >= self.failures_to_open:
            if self._failures == self.failures_to_open:
                self.opened += 1
                log.warning("%s: circuit open for %.1fs", self.name, self.cooldown_s)
            self._open_until = self._clock() + self.cooldown_s
