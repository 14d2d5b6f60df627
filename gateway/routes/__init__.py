"""The gateway's ordinary HTTP routes (FastAPI), one module per concern; the hot-path client APIs
are raw ASGI apps instead (``gateway.handler.ApiRoute``).

- ``models``: ``GET /v1/models`` and ``GET /v1/models/{id}`` (``add_model_routes``);
- ``ops``: ``/healthz``, ``/readyz`` (per-pool replica counts, ``degraded`` while Redis is down)
  and ``/metrics`` (``add_ops_routes``);
- ``usage_totals``: ``GET /v1/usage``, the totals of a session or an API key (``add_usage_route``);
- ``json_answers``: ``error_response`` / ``json_response`` and the HTTP/validation error handlers in
  the OpenAI error shape (``install_error_handlers``).
"""
