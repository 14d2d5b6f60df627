"""JSON answers and errors of the ordinary routes, in the OpenAI error shape."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response

from gateway.errors import GatewayError


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
        status = exc.status_code
        err = GatewayError(
            str(exc.detail),
            status=status,
            type="invalid_request_error" if status < 500 else "server_error",
            code={404: "not_found", 405: "method_not_allowed"}.get(status),
        )
        return Response(err.to_bytes(), status_code=status, media_type="application/json",
                        headers=dict(exc.headers or {}))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        err = GatewayError(str(exc), status=400, type="invalid_request_error")
        return Response(err.to_bytes(), status_code=400, media_type="application/json")
