"""The Responses API's routes besides ``POST /v1/responses`` (ordinary FastAPI routes, OpenAI
error shape): ``GET`` and ``DELETE /v1/responses/{id}``, ``GET /v1/responses/{id}/input_items``
and ``POST /v1/responses/{id}/cancel``, each for the API key that made the response.

``{id}`` matches only the gateway's response ids (``resp_`` + id characters, the
``response_id`` path convertor), so a fixed sub-path (``/v1/responses/input_tokens``,
``/v1/responses/compact``, any future one) never matches it: it is served by its own route, or
is the API's 404, never a 405 from a route of another method."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import orjson
from fastapi import FastAPI
from starlette.convertors import Convertor, register_url_convertor
from starlette.requests import Request
from starlette.responses import Response

from gateway.errors import GatewayError
from gateway.protocols.responses.input_list import list_page, parse_limit
from gateway.protocols.responses.state import ResponseNotFound, ResponsesState


def _answer(status: int, body: bytes, headers: dict[str, str] | None = None) -> Response:
    return Response(body, status_code=status, media_type="application/json", headers=headers)


class ResponseIdConvertor(Convertor[str]):
    """A path segment that is a gateway response id: ``resp_`` then id characters."""

    regex = "resp_[A-Za-z0-9_-]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("response_id", ResponseIdConvertor())

# the fixed sub-paths of /v1/responses/ (served or the API's 404); any other single segment
# (optionally with /cancel or /input_items) is a response id, malformed when no route took it
_FIXED_SEGMENTS = frozenset({"input_tokens", "compact"})
_ID_PATH = re.compile(r"^/v1/responses/([^/]+)(?:/cancel|/input_items)?$")


def malformed_response_id(path: str) -> str | None:
    """The id segment of a ``/v1/responses/{id}[/cancel|/input_items]`` path that no route
    matched (an id not of the ``resp_`` shape), or None for any other path: such a path is
    answered as a missing response (404 ``response_not_found``), the same answer as for a
    well-formed id that names nothing, so no id shape tells anything apart."""
    m = _ID_PATH.match(path)
    if m is None or m.group(1) in _FIXED_SEGMENTS:
        return None
    return m.group(1)


def response_not_found(response_id: str) -> ResponseNotFound:
    """OpenAI's 404 for an id that names no response of the caller's (quoted bounded)."""
    shown = response_id if len(response_id) <= 64 else response_id[:61] + "..."
    return ResponseNotFound(f"Response with id '{shown}' not found.", param="response_id")


def add_response_routes(
    app: FastAPI, authenticate: Callable[[Any], Any], state: ResponsesState
) -> None:
    """Register the routes on ``app``. ``authenticate(scope)`` returns the caller's key (None
    with auth off) or raises a 401."""

    def key_id(request: Request) -> str | None:
        key = authenticate(request.scope)
        return key.id if key is not None else None

    @app.get("/v1/responses/{response_id:response_id}/input_items")
    async def list_input_items(request: Request, response_id: str) -> Response:
        """The input items of a stored response (``responses.input_list``)."""
        q = request.query_params
        try:
            limit = parse_limit(q.get("limit"))
            items = await state.input_items(response_id, key_id(request))
            page = list_page(items, after=q.get("after"), limit=limit, order=q.get("order"))
            return _answer(200, orjson.dumps(page))
        except GatewayError as e:
            return _answer(e.status, e.to_bytes(), e.headers())

    @app.get("/v1/responses/{response_id:response_id}")
    async def retrieve_response(request: Request, response_id: str) -> Response:
        """A stored response (``store`` true), for the key that made it."""
        try:
            return _answer(200, orjson.dumps(await state.retrieve(response_id, key_id(request))))
        except GatewayError as e:
            return _answer(e.status, e.to_bytes(), e.headers())

    @app.delete("/v1/responses/{response_id:response_id}")
    async def delete_response(request: Request, response_id: str) -> Response:
        """Delete a stored response: ``{"id", "object": "response.deleted", "deleted": true}``."""
        try:
            return _answer(200, orjson.dumps(await state.delete(response_id, key_id(request))))
        except GatewayError as e:
            return _answer(e.status, e.to_bytes(), e.headers())

    @app.post("/v1/responses/{response_id:response_id}/cancel")
    async def cancel_response(request: Request, response_id: str) -> Response:
        """Cancel a response running on this gateway process (its replica is told, the
        generation aborted)."""
        try:
            doc = await state.cancel(response_id, key_id(request))
            return _answer(200, orjson.dumps(doc))
        except GatewayError as e:
            return _answer(e.status, e.to_bytes(), e.headers())
