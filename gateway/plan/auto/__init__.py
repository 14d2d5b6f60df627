"""The ``auto`` tier: standard or fast per request, from live measurements.

- ``estimator``: per-pool load-conditioned models of TTFT, prefill rate and TPOT, fitted by
  exponentially decayed ridge regression on the gateway's own measurements, plus spec-decode
  acceptance; pure state;
- ``decide``: the rule (expected completion time per pool, hysteresis per session, exploration,
  reasons); pure;
- ``service``: ``AutoTier``, the process's live state (estimators, session table, seeded RNG,
  decision counters, spec-decode scraper, metrics collector).
"""

from gateway.plan.auto.decide import AutoParams, PoolView, RequestFacts, TierDecision, decide
from gateway.plan.auto.estimator import Measurement, PoolEstimate, PoolEstimator

__all__ = [
    "AutoParams",
    "Measurement",
    "PoolEstimate",
    "PoolEstimator",
    "PoolView",
    "RequestFacts",
    "TierDecision",
    "decide",
]
