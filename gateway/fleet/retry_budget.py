"""The per-pool retry budget: how many retries a pool may take in a sliding window. Pure (clock
injected).

Vocabulary and semantics from Envoy's retry budgets (``budget_percent`` and a floor like
``min_retry_concurrency``).
"""

from __future__ import annotations

from collections import deque

from gateway.config import RetryConfig


class RetryBudget:
    """Retries allowed in a sliding window: at most ``budget_percent`` % of the requests the pool
    received in the last ``budget_window_s`` seconds, plus ``budget_min_retries`` (the floor
    that lets a quiet pool still retry). An outage thus adds at most ~20 % load, not 3×.

    ``record_request(now)`` once per request routed to the pool (first attempts and
    fallbacks); ``try_acquire(now)`` before each retry, True when the retry may go.
    """

    __slots__ = ("_config", "_requests", "_retries", "exhausted")

    def __init__(self, config: RetryConfig) -> None:
        self._config = config
        self._requests: deque[float] = deque()
        self._retries: deque[float] = deque()
        self.exhausted = 0  # retries refused, for metrics

    def _trim(self, now: float) -> None:
        horizon = now - self._config.budget_window_s
        for q in (self._requests, self._retries):
            while q and q[0] < horizon:
                q.popleft()

    def record_request(self, now: float) -> None:
        """Count one request routed to this pool at ``now`` (seconds, monotonic)."""
        self._requests.append(now)
        if len(self._requests) > 100_000:  # memory bound under extreme rates
            self._trim(now)

    def allowed(self, now: float) -> int:
        """How many retries the window allows in total right now."""
        self._trim(now)
        pct = self._config.budget_percent / 100.0
        return int(len(self._requests) * pct) + self._config.budget_min_retries

    def try_acquire(self, now: float) -> bool:
        """Take one retry from the budget; False (and counted) when it is spent. The window is
        trimmed before the retries in it are counted (else a burst long past would still
        count against the first retry after a quiet period)."""
        allowed = self.allowed(now)  # trims both windows to the last budget_window_s
        if len(self._retries) < allowed:
            self._retries.append(now)
            return True
        self.exhausted += 1
        return False
