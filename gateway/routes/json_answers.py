"""JSON answers and errors of the ordinary routes, in the OpenAI error shape."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response

from gateway.asgi import request_id
from gateway.errors import GatewayError
from gateway.protocols.error_shapes import ANTHROPIC_ERRORS, OPENAI_ERRORS
from gateway.protocols.responses.routes import malformed_response_id, response_not_found


def error_response(e: GatewayError) -> Response:
    """``e`` as its status, JSON body (``{"error": {...}}``) and headers (``retry-after``...)."""
    return Response(e.to_bytes(), status_code=e.status, media_type="application/json",
                    headers=e.headers())


def json_response(status: int, doc: Any) -> Response:
    """``doc`` serialised with orjson under ``status``."""
    return Response(orjson.dumps(doc), status_code=status, media_type="application/json")


def install_error_handlers(app: FastAPI) -> None:
    """Starlette's HTTP errors (404, 405 ...) and request validation errors (400) answered in
    the OpenAI error shape instead of FastAPI's ``{"detail": ...}``."""

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        """No route (404) or no such method (405), in the API's own shape: a path the gateway
        cannot serve is OpenAI's ``Invalid URL (METHOD /path)`` (Anthropic's
        ``not_found_error`` under ``/v1/messages``), so clients fall back; a junk
        ``/v1/responses/{id}`` is a missing response (``response_not_found``). The body's
        ``request_id`` is the one the middleware put in the ``x-request-id`` header."""
        status = exc.status_code
        path = request.url.path
        message = (f"Invalid URL ({request.method} {path})" if status == 404
                   else str(exc.detail))
        err = GatewayError(
            message,
            status=status,
            type="invalid_request_error" if status < 500 else "server_error",
            code={404: "not_found", 405: "method_not_allowed"}.get(status),
        )
        if status == 404 and (bad_id := malformed_response_id(path)) is not None:
            err = response_not_found(bad_id)  # a junk id is a missing response, not a path
        shape = ANTHROPIC_ERRORS if path.startswith("/v1/messages") else OPENAI_ERRORS
        headers = {k.decode(): v.decode() for k, v in shape.headers(err)}
        rid = request.scope.get("speedgate.request_id") or request_id(request.scope)
        return Response(shape.body(err, rid), status_code=status,
                        media_type="application/json", headers=headers | dict(exc.headers or {}))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        return error_response(GatewayError(str(exc), status=400, type="invalid_request_error"))
