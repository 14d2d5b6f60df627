"""``GET /v1/models`` and ``GET /v1/models/{id}``: every name a client may send (models, their
tiers as ``model/tier``, aliases), in the OpenAI list shape.

Each entry carries ``max_model_len`` (vLLM's field on its own ``/v1/models``): the most tokens,
prompt and output together, that every replica a request for that name may reach takes, i.e.
the smallest learned limit (``gateway.routing.fit.capacity_tokens``) among them: a tier's
entry over that tier's pool, the model's own entry and an ``auto`` alias over all its tiers.
The field is absent while no such replica's limit is known (not yet probed)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from gateway.config import GatewayConfig
from gateway.errors import GatewayError
from gateway.fleet.pools import PoolRegistry
from gateway.plan.tiers import ModelIndex
from gateway.routes.json_answers import error_response, json_response
from gateway.routing.fit import capacity_tokens


def add_model_routes(
    app: FastAPI, config: GatewayConfig, models: ModelIndex,
    authenticate: Callable[[Any], object], pools: PoolRegistry | None = None,
) -> None:
    """Add the two model routes to ``app``; ``authenticate(scope)`` raises a ``GatewayError``
    for a caller without a valid key (auth off: it lets everyone through). ``created`` is the
    app's creation time (Unix seconds). ``pools``: where the replicas' learned limits are read
    (None: no ``max_model_len`` field)."""
    created = int(time.time())

    def max_model_len(model_name: str, tier: str | None) -> int | None:
        if pools is None:
            return None
        tiers = [tier] if tier in config.models[model_name].tiers else list(
            config.models[model_name].tiers)
        known = [n for t in tiers if (p := pools.get(model_name, t)) is not None
                 for r in p.replicas if (n := capacity_tokens(r))]
        return min(known, default=None)

    def entry(item: tuple[str, str, Any]) -> dict[str, Any]:
        name, model_name, tier = item
        m = config.models[model_name]
        out: dict[str, Any] = {"id": name, "object": "model", "created": created,
                               "owned_by": "speedgate"}
        if tier is None:
            out["tiers"] = list(m.tiers)
            out["default_tier"] = m.default_tier
            out["aliases"] = dict(m.aliases)
        else:
            out["parent"] = model_name
            out["tier"] = tier
        if (limit := max_model_len(model_name, tier)) is not None:
            out["max_model_len"] = limit
        return out

    @app.get("/v1/models")
    async def list_models(request: Request) -> Response:
        try:
            authenticate(request.scope)
        except GatewayError as e:
            return error_response(e)
        return json_response(200, {"object": "list", "data": [entry(n) for n in models.names()]})

    @app.get("/v1/models/{model_id:path}")
    async def retrieve_model(request: Request, model_id: str) -> Response:
        try:
            authenticate(request.scope)
        except GatewayError as e:
            return error_response(e)
        for item in models.names():
            if item[0] == model_id:
                return json_response(200, entry(item))
        return error_response(GatewayError(
            f"The model `{model_id}` does not exist.", status=404,
            type="invalid_request_error", code="model_not_found", param="model"))
