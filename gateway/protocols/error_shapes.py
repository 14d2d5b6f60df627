"""Errors in each API's own shape: the gateway's ``GatewayError`` rendered as OpenAI or
Anthropic errors, before the first byte (status + JSON body) and after it (one in-band event).

- **OpenAI** (chat, completions, responses): ``{"error": {"message", "type", "param", "code"}}``
  with the gateway's status (OpenAI API reference, "Error codes"). In a chat or completions
  stream the in-band event is ``data: {"error": {...}}``; in a Responses stream it is the API's
  ``error`` event, ``event: error`` + ``{"type": "error", "code", "message", "param",
  "sequence_number"}`` (OpenAI API reference, Responses streaming events, "error").
- **Anthropic** (messages, count_tokens): ``{"type": "error", "error": {"type", "message"},
  "request_id"}`` with Anthropic's statuses and types (Anthropic API reference, "Errors"): 400
  ``invalid_request_error`` (also any other 4xx), 401 ``authentication_error``, 403
  ``permission_error``, 404 ``not_found_error``, 413 ``request_too_large``, 429
  ``rate_limit_error``, 500 ``api_error``, 504 ``timeout_error``, 529 ``overloaded_error``. The
  gateway's 503 (no usable replica, shutting down) is Anthropic's 529 and its 502 (engine
  failure) Anthropic's 500; in a stream the in-band event is ``event: error`` with the same
  object.
"""

from __future__ import annotations

import orjson

from gateway.common.sse import encode_event
from gateway.errors import SHOULD_RETRY, GatewayError, should_retry

_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
_ANTHROPIC_STATUS = {503: 529, 502: 500}


class ErrorShape:
    """How one API shapes errors: ``status``, ``body`` and ``headers`` of an error response,
    and ``event`` for an error after the stream started. The base is OpenAI's chat shape."""

    def status(self, err: GatewayError) -> int:
        """The HTTP status of ``err`` in this API."""
        return err.status

    def body(self, err: GatewayError, request_id: str | None = None) -> bytes:
        """The JSON error body of ``err``."""
        return err.to_bytes()

    def headers(self, err: GatewayError) -> list[tuple[bytes, bytes]]:
        """Extra response headers of ``err`` (``Retry-After``; ``x-should-retry`` of the status
        this API answers, e.g. Anthropic's 529 for the gateway's 503)."""
        out = err.headers()
        status = self.status(err)
        if status != err.status:  # the hint of the status this API answers
            out.pop(SHOULD_RETRY, None)
            hint = should_retry(status, err.retry_after_s is not None)
            if hint is not None:
                out[SHOULD_RETRY] = hint
        return [(k.encode(), v.encode()) for k, v in out.items()]

    def event(self, err: GatewayError, sequence_number: int) -> bytes:
        """One in-band SSE error event; ``sequence_number`` is the event's place in a stream
        that numbers its events (Responses), ignored otherwise."""
        return encode_event(err.to_bytes())


class ResponsesErrorShape(ErrorShape):
    """OpenAI error bodies; the Responses stream's typed ``error`` event in-band."""

    def event(self, err: GatewayError, sequence_number: int) -> bytes:
        doc = {
            "type": "error",
            "code": err.code or err.type,
            "message": err.message,
            "param": err.param,
            "sequence_number": sequence_number,
        }
        return b"event: error\n" + encode_event(orjson.dumps(doc))


class AnthropicErrorShape(ErrorShape):
    """Anthropic's error object, statuses and types (module docstring)."""

    def status(self, err: GatewayError) -> int:
        return _ANTHROPIC_STATUS.get(err.status, err.status)

    def error_type(self, err: GatewayError) -> str:
        """Anthropic's ``error.type`` for ``err``."""
        status = self.status(err)
        known = _ANTHROPIC_TYPES.get(status)
        if known:
            return known
        return "invalid_request_error" if status < 500 else "api_error"

    def object(self, err: GatewayError, request_id: str | None) -> dict[str, object]:
        """The error document ``{"type": "error", "error": {...}, "request_id"}``."""
        doc: dict[str, object] = {
            "type": "error",
            "error": {"type": self.error_type(err), "message": err.message_for("anthropic")},
        }
        if request_id:
            doc["request_id"] = request_id
        return doc

    def body(self, err: GatewayError, request_id: str | None = None) -> bytes:
        return orjson.dumps(self.object(err, request_id))

    def event(self, err: GatewayError, sequence_number: int) -> bytes:
        return b"event: error\n" + encode_event(orjson.dumps(self.object(err, None)))


OPENAI_ERRORS = ErrorShape()
RESPONSES_ERRORS = ResponsesErrorShape()
ANTHROPIC_ERRORS = AnthropicErrorShape()
