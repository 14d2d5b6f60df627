"""Errors the gateway returns, in the OpenAI error shape, and the mapping of engine errors.

Every error body is ``{"error": {"message", "type", "param", "code"}}`` (OpenAI API reference,
"Error codes"). ``GatewayError`` subclasses map one-to-one to what the caller can do about them.
"""

from __future__ import annotations

from typing import Any

import orjson


class GatewayError(Exception):
    """An error answered to the client with ``status`` and an OpenAI-shaped body.

    ``retry_after_s`` (seconds) adds a ``Retry-After`` header when set.
    """

    status: int = 500
    type: str = "server_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        type: str | None = None,
        code: str | int | None = None,
        param: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if type is not None:
            self.type = type
        if code is not None:
            self.code = str(code) if not isinstance(code, str) else code
        self.param = param
        self.retry_after_s = retry_after_s

    def message_for(self, api: str) -> str:
        """This error's message in the words of ``api`` (``openai`` | ``anthropic``): the same
        text for every API unless a subclass words it per API (``ContextTooLong``)."""
        return self.message

    def body(self) -> dict[str, Any]:
        """The OpenAI error object ``{"error": {...}}``."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def to_bytes(self) -> bytes:
        """The error body serialised as JSON bytes."""
        return orjson.dumps(self.body())

    def headers(self) -> dict[str, str]:
        """Extra response headers: ``Retry-After`` in whole seconds, rounded up, and
        ``x-should-retry`` (:func:`should_retry`) of this error's status."""
        out: dict[str, str] = {}
        if self.retry_after_s is not None:
            out["retry-after"] = str(max(1, int(-(-self.retry_after_s // 1))))
        hint = should_retry(self.status, self.retry_after_s is not None)
        if hint is not None:
            out[SHOULD_RETRY] = hint
        return out


#: The retry hint the Stainless-generated SDKs (``openai``, ``anthropic``) obey before their
#: own status rules (``_base_client.py``, ``_should_retry``: ``"true"`` retries, ``"false"``
#: does not; else 408, 409, 429 and 5xx are retried).
SHOULD_RETRY = "x-should-retry"
#: 4xx statuses a client may retry (a timeout, a lock, a rate limit): the SDKs' own rule.
_RETRYABLE_4XX = frozenset({408, 409, 429})


def should_retry(status: int, has_retry_after: bool) -> str | None:
    """``x-should-retry`` for an error answer of ``status``: ``"false"`` for a client error the
    same request repeats (400, 401, 403, 404, 405, 413, 415, 422...: every 4xx but 408, 409 and
    429), ``"true"`` for 429, for 503 with a ``Retry-After`` (the gateway knows when capacity
    comes back) and for 529 (Anthropic's overloaded), None otherwise (other 5xx: the SDKs'
    own rule retries them). A budget refusal (429 that no retry cures) sets ``"false"`` itself
    (``gateway.admit.budget.BudgetExceeded``)."""
    if 400 <= status < 500:
        return "true" if status == 429 else (None if status in _RETRYABLE_4XX else "false")
    if status == 529 or (status == 503 and has_retry_after):
        return "true"
    return None


class InvalidRequest(GatewayError):
    """400: the request is malformed (invalid JSON, wrong field types)."""

    status = 400
    type = "invalid_request_error"


class UnsupportedMediaType(GatewayError):
    """415: the body is not ``application/json``."""

    status = 415
    type = "invalid_request_error"
    code = "unsupported_media_type"


class BodyTooLarge(GatewayError):
    """413: the body exceeds ``server.max_body_bytes``."""

    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class ModelNotFound(GatewayError):
    """404: the model name is neither a configured model nor an alias."""

    status = 404
    type = "invalid_request_error"
    code = "model_not_found"


class ClientTimeout(GatewayError):
    """408: the client sent its request (headers or body) too slowly
    (``gateway.admit.connections``); the connection is closed."""

    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


class NoHealthyReplica(GatewayError):
    """503: no replica of any pool in the request's fallback chain can take it now."""

    status = 503
    type = "server_error"
    code = "no_healthy_replica"


class UpstreamError(GatewayError):
    """502: the engine failed (connection error, 5xx, broken or malformed stream)."""

    status = 502
    type = "server_error"
    code = "upstream_error"


class UnreadableResponse(UpstreamError):
    """502: the engine's response cannot be read, and would not be on any other replica (a
    content coding the gateway cannot decode, an SSE event over the size cap): deterministic,
    so it is neither retried nor counted against the replica's health."""

    code = "upstream_unreadable"


class UpstreamTimeout(GatewayError):
    """504: a staged timeout expired (connect, ttft, stall, read or total); ``stage`` names
    which. Answered with ``Retry-After: 1`` (like the 503 of no usable replica: the pools were
    too slow just now, the client may try again shortly). Not a ``retry_after_s``: no engine
    asked the gateway to wait, so failover does not wait for it."""

    status = 504
    type = "timeout"
    code = "upstream_timeout"
    RETRY_AFTER = "1"

    def __init__(self, stage: str, seconds: float) -> None:
        super().__init__(f"upstream {stage} timeout after {seconds:g}s")
        self.stage = stage

    def headers(self) -> dict[str, str]:
        """``Retry-After: 1`` (seconds)."""
        return {"retry-after": self.RETRY_AFTER}


class EngineClientError(GatewayError):
    """An engine's 4xx, passed through with its status, message, type, param and code."""


class UpstreamOverloaded(EngineClientError):
    """503 ``upstream_overloaded``: the engine said it is overloaded (HTTP 529, Anthropic's
    ``overloaded_error``, in-band or as the body's type): busy, not broken, so retried on
    another replica and not counted against the replica's health. The Anthropic shape answers
    it 529 ``overloaded_error`` (``gateway.protocols.error_shapes``: the gateway's 503 is
    Anthropic's 529); the OpenAI shape 503 ``server_error``, the status OpenAI answers when
    overloaded."""

    status = 503
    type = "server_error"
    code = "upstream_overloaded"


#: HTTP status an Anthropic-compatible server answers when overloaded (Anthropic API
#: reference, "Errors": 529 ``overloaded_error``)
OVERLOADED_STATUS = 529
OVERLOADED_TYPE = "overloaded_error"


def parse_engine_error(
    status: int, body: bytes, retry_after_s: float | None = None
) -> EngineClientError:
    """Map an engine error response to an OpenAI-shaped error keeping the engine's message.

    Understands both vLLM shapes: ``{"error": {"message", "type", "param", "code"}}`` (vLLM ≥
    0.10) and the older flat ``{"object": "error", "message", "type", "param", "code"}``. A body
    that is neither keeps its text (truncated to 1000 characters) as the message. Statuses ≥ 500
    (and any other non-200 below 400) become 502 ``upstream_error``, except a 503 with a
    ``Retry-After`` (``retry_after_s``, seconds): that stays a 503 ``upstream_unavailable``
    carrying it, so a client that the gateway cannot make wait learns when to come back; 4xx
    keep their status, and a string ``code`` (the engine's, else the status's name:
    ``not_found``). ``retry_after_s`` is kept on the error either way. An overload (HTTP 529,
    or a 5xx whose error ``type`` is ``overloaded_error``) is ``UpstreamOverloaded`` (503).
    """
    message: str | None = None
    param: str | None = None
    code: Any = None
    try:
        doc = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        doc = None
    if isinstance(doc, dict):
        error = doc.get("error")
        inner: dict[str, Any] = error if isinstance(error, dict) else doc
        if isinstance(inner.get("message"), str):
            message = inner["message"]
            param = inner.get("param") if isinstance(inner.get("param"), str) else None
            code = inner.get("code")
        elif isinstance(doc.get("detail"), str):  # FastAPI's default error shape
            message = doc["detail"]
    if message is None:
        text = body[:1000].decode("utf-8", "replace").strip()
        message = text or f"engine returned HTTP {status}"
    if status == OVERLOADED_STATUS or (
            status >= 500 and isinstance(doc, dict) and _error_type(doc) == OVERLOADED_TYPE):
        return UpstreamOverloaded(
            f"engine overloaded (HTTP {status}): {message}", retry_after_s=retry_after_s)
    if status == 503 and retry_after_s is not None:
        return EngineClientError(
            f"engine unavailable (HTTP 503): {message}",
            status=503,
            type="server_error",
            code="upstream_unavailable",
            retry_after_s=retry_after_s,
        )
    if status >= 500 or status < 400:  # a 5xx, or a 1xx/2xx/3xx that is not an answer
        return EngineClientError(
            f"engine error (HTTP {status}): {message}",
            status=502,
            type="server_error",
            code="upstream_error",
            retry_after_s=retry_after_s,
        )
    return EngineClientError(
        message,
        status=status,
        type=_openai_type(status),
        param=param,
        # vLLM sends the status as an int code (or none): a client switches on a string
        # (some send it as a string, "400": normalised alike)
        code=code if isinstance(code, str) and code and not code.isdigit() else _status_code(
            status),
        retry_after_s=retry_after_s,
    )


def stream_error(doc: dict[str, Any]) -> GatewayError:
    """The client-facing error for an engine's in-stream ``{"error": {...}}`` event (OpenAI
    shape; vLLM sends it after a 200 when generation raises: ``create_streaming_error_response``
    in vllm/entrypoints/openai/serving_engine.py, ``code`` the HTTP status it would have
    answered; an int, or a digit string). A ``code`` of 400-499 other than 408/429 becomes
    the ``EngineClientError`` the engine's HTTP answer would have given (``parse_engine_error``:
    its status, message, type and code); whose fault it is the caller decides (vLLM gives any
    exception in generation 400, so a broken replica sends it too). Anything else (5xx, no
    code) is the replica's: ``UpstreamError`` (502) with the message; an overload (``code``
    529 or ``type`` ``overloaded_error``) ``UpstreamOverloaded`` (503)."""
    inner = doc.get("error")
    code = inner.get("code") if isinstance(inner, dict) else None
    if isinstance(code, str) and code.isdigit():
        code = int(code)
    if code == OVERLOADED_STATUS or _error_type(doc) == OVERLOADED_TYPE:
        message = inner.get("message") if isinstance(inner, dict) else None
        return UpstreamOverloaded(f"engine overloaded: {message or 'overloaded'}")
    if type(code) is int and 400 <= code < 500 and code not in (408, 429):
        return parse_engine_error(code, orjson.dumps(doc))
    message = inner.get("message") if isinstance(inner, dict) else inner
    return UpstreamError(f"engine error: {message if isinstance(message, str) else inner}")


def _error_type(doc: dict[str, Any]) -> object:
    """The ``type`` of an error document, in either shape (``{"error": {"type"}}`` or flat)."""
    inner = doc.get("error")
    return inner.get("type") if isinstance(inner, dict) else doc.get("type")


def is_client_fault(err: GatewayError | None) -> bool:
    """True for an engine's 4xx that names the client (not 408/429): an HTTP one is answered
    as is; an in-stream one is the client's only when another replica says so too (failover)."""
    return isinstance(err, EngineClientError) and 400 <= err.status < 500 and err.status not in (
        408, 429)


#: ``code`` of an engine 4xx that names none (vLLM sends ``code: 404``, an int): the snake_case
#: name of the HTTP status (RFC 9110 §15.5), as the gateway's own errors use (``not_found``).
_STATUS_CODES = {
    400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
    405: "method_not_allowed", 408: "request_timeout", 409: "conflict",
    413: "request_too_large", 415: "unsupported_media_type", 422: "unprocessable_content",
    429: "rate_limit_exceeded",
}


def _status_code(status: int) -> str:
    return _STATUS_CODES.get(status, f"http_{status}")


def _openai_type(status: int) -> str:
    """OpenAI error ``type`` for an engine 4xx (vLLM sends exception class names instead)."""
    return {
        401: "authentication_error",
        403: "permission_error",
        429: "rate_limit_error",
    }.get(status, "invalid_request_error")
