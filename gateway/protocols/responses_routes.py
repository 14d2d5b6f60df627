"""The Responses API's routes besides ``POST /v1/responses`` (ordinary FastAPI routes, OpenAI
error shape): ``GET`` and ``DELETE /v1/responses/{id}`` and ``POST
/v1/responses/{id}/cancel``, each for the API key that made the response."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from gateway.errors import GatewayError
from gateway.protocols.responses_state import ResponsesState


def _answer(status: int, body: bytes, headers: dict[str, str] | None = None) -> Response:
    return Response(body, status_code=status, media_type="application/json", headers=headers)


def add_response_routes(
    app: FastAPI, authenticate: Callable[[Any], Any], state: ResponsesState
) -> None:
    """Register the routes on ``app``. ``authenticate(scope)`` returns the caller's key (None
    with auth off) or raises a 401."""

    def key_id(request: Request) -> str | None:
        key = authenticate(request.scope)
        return key.id if key is not None else None

    @app.get("/v1/responses/{response_id}")
    async def retrieve_response(request: Request, response_id: str) -> Response:
        """A stored response (``store`` true), for the key that made it."""
        try:
            return _answer(200, orjson.dumps(await state.retrieve(response_id, key_id(request))))
        except GatewayError as e:
            return _answer(e.status, e.to_bytes(), e.headers())

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(request: Request, response_id: str) -> Response:
        """Delete a stored response: ``{"id", "object": "response.deleted", "deleted": true}``."""
        try:
            return _answer(200, orjson.dumps(await state.delete(response_id, key_id(request))))
        except GatewayError as e:
            return _answer(e.status, e.to_bytes(), e.headers())

    @app.post("/v1/responses/{response_id}/cancel")
    async def cancel_response(request: Request, response_id: str) -> Response:
        """Cancel a response running on this gateway process (its replica is told, the
        generation aborted)."""
        try:
            doc = await state.cancel(response_id, key_id(request))
            return _answer(200, orjson.dumps(doc))
        except GatewayError as e:
            return _answer(e.status, e.to_bytes(), e.headers())
