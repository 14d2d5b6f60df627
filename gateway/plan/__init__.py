"""Planning, the second step: which tier serves the request, and what to fall back to.

- ``tiers``: ``ModelIndex`` (model names and aliases → a model and a ``TierRequest``: header,
  alias, ``service_tier``, default) and ``TIER_TO_SERVICE_TIER``;
- ``chain``: ``plan_request`` → ``Plan``, the ordered pools to try (the fallback chain);
- ``auto/``: the ``auto`` tier, standard or fast per request from live measurements.
- ``kv_fit``: ``fit_replicas``, the request's tokens (prompt + output cap:
  ``estimate_tokens``, ``output_cap``) against each replica's context and KV pool, narrowing
  the chain to the pools it fits.
"""
