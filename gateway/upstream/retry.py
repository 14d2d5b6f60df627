"""Retry policy: backoff with full jitter (the per-pool retry budget is the fleet's:
``gateway.fleet.retry_budget``). Pure (clock injected).

Vocabulary and semantics from Envoy (``retry_on``, retry budgets with ``budget_percent`` and a
floor like ``min_retry_concurrency``); backoff from "Exponential Backoff And Jitter" (AWS
Architecture Blog, Brooker 2015): sleep = uniform(0, min(cap, base × 2^attempt)).
"""

from __future__ import annotations

import random

from gateway.config import RetryConfig


def full_jitter_backoff_s(
    retry_index: int, config: RetryConfig, rng: random.Random | None = None
) -> float:
    """Seconds to wait before retry number ``retry_index`` (1 = first retry)."""
    cap = min(config.backoff_max_s, config.backoff_base_s * (2 ** max(0, retry_index - 1)))
    return (rng or random).uniform(0.0, cap)
