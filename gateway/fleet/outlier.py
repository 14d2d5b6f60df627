"""Passive outlier ejection of replicas (Envoy's ``outlier_detection`` semantics). Pure.

``consecutive_failures`` failed attempts in a row (connection errors, 5xx, timeouts, broken
streams; not 4xx and not 429, which say nothing about the replica's health) eject the replica
for ``base_ejection_s × 2^(n-1)`` seconds (n = times ejected in a row), capped at
``max_ejection_s``. When the time is up it is re-admitted on probation: one failure re-ejects it
for longer; ``probation_successes`` successes end probation and reset n. At most
``max_ejection_percent`` % of a pool (at least one replica) is ejected at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.config import OutlierConfig


@dataclass(slots=True)
class OutlierState:
    """Ejection state of one replica; times are monotonic seconds."""

    consecutive_failures: int = 0
    ejected_until: float = 0.0
    times_ejected: int = 0
    probation: bool = False
    probation_successes: int = 0
    ejections_total: int = 0

    def is_ejected(self, now: float) -> bool:
        """True while the replica is ejected."""
        return now < self.ejected_until


def record_success(state: OutlierState, config: OutlierConfig) -> None:
    """A successful attempt: resets the failure streak; may end probation."""
    state.consecutive_failures = 0
    if state.probation:
        state.probation_successes += 1
        if state.probation_successes >= config.probation_successes:
            state.probation = False
            state.times_ejected = 0


def record_failure(
    state: OutlierState, config: OutlierConfig, now: float, may_eject: bool
) -> bool:
    """A failed attempt at ``now``. Returns True when this failure ejected the replica.

    ``may_eject`` is False when ejecting would exceed the pool's ``max_ejection_percent``.
    """
    if state.is_ejected(now):
        return False
    state.consecutive_failures += 1
    if not (state.probation or state.consecutive_failures >= config.consecutive_failures):
        return False
    if not may_eject:
        return False
    state.times_ejected += 1
    duration = min(config.max_ejection_s, config.base_ejection_s * 2 ** (state.times_ejected - 1))
    state.ejected_until = now + duration
    state.consecutive_failures = 0
    state.probation = True
    state.probation_successes = 0
    state.ejections_total += 1
    return True


def max_ejected(pool_size: int, config: OutlierConfig) -> int:
    """Replicas of a pool of ``pool_size`` that may be ejected at once (≥ 1)."""
    return max(1, int(pool_size * config.max_ejection_percent / 100.0))
