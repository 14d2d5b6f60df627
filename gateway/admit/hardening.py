"""Input sanity limits beyond the body size (``asgi.read_body``) and content type.

- Request headers: at most ``server.max_header_bytes`` in total (names + values) and
  ``MAX_HEADERS`` of them; otherwise 431 ``request_header_fields_too_large`` (RFC 6585 §5).
  uvicorn's httptools parser has no such limit of its own.
- JSON bodies: nesting at most ``server.max_json_depth`` deep (orjson itself stops at 1024, far
  more than any OpenAI request needs, and deep documents make later recursive code slow), and
  at most ``MAX_JSON_NODES`` arrays/objects/values in total; otherwise 400 ``invalid_json``.

The model and the tier come only from the body and the documented ``x-speedgate-tier`` header:
the handler never reads the query string.
"""

from __future__ import annotations

from typing import Any

from gateway.errors import GatewayError, InvalidRequest

MAX_HEADERS = 100
MAX_JSON_NODES = 2_000_000


class HeadersTooLarge(GatewayError):
    """431: too many request headers, or too many bytes of them."""

    status = 431
    type = "invalid_request_error"
    code = "request_header_fields_too_large"


def check_headers(headers: list[tuple[bytes, bytes]], max_bytes: int) -> None:
    """Raise ``HeadersTooLarge`` when ``headers`` (an ASGI scope's) exceed the limits."""
    if len(headers) > MAX_HEADERS:
        raise HeadersTooLarge(f"more than {MAX_HEADERS} request headers")
    total = 0
    for k, v in headers:
        total += len(k) + len(v)
    if total > max_bytes:
        raise HeadersTooLarge(f"request headers exceed {max_bytes} bytes")


def check_json_shape(doc: Any, max_depth: int, max_nodes: int = MAX_JSON_NODES) -> None:
    """Raise ``InvalidRequest`` (400 ``invalid_json``) when ``doc`` nests deeper than
    ``max_depth`` containers or has more than ``max_nodes`` values. Iterative: no recursion."""
    stack: list[tuple[Any, int]] = [(doc, 1)]
    nodes = 0
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            raise InvalidRequest(
                f"request body nests deeper than {max_depth} levels", code="invalid_json"
            )
        children = node.values() if isinstance(node, dict) else node
        for child in children:
            nodes += 1
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
        if nodes > max_nodes:
            raise InvalidRequest(
                f"request body has more than {max_nodes} JSON values", code="invalid_json"
            )
