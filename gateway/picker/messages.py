"""Envoy ``ext_proc`` messages of the endpoint picker protocol (Gateway API Inference
Extension, ``docs/proposals/004-endpoint-picker-protocol``), built from the
``envoy.service.ext_proc.v3`` stubs of the ``xds-protos`` package.

- the pick: header ``x-gateway-destination-endpoint`` and dynamic metadata
  ``envoy.lb/x-gateway-destination-endpoint``, the same value (``ip:port`` or an ordered,
  comma-separated list that Envoy's retries walk down);
- the subset hint: filter metadata ``envoy.lb.subset_hint/x-gateway-destination-endpoint-subset``
  (a list of ``ip:port``) in the request's ``metadata_context``;
- the served endpoint: ``envoy.lb/x-gateway-destination-endpoint-served`` in the response's
  ``metadata_context``, else Envoy's ``upstream.address`` attribute;
- errors: an ``ImmediateResponse`` (503 when nothing is usable, 429 with ``Retry-After`` when
  admission sheds) whose body is the client API's own error JSON.
"""

from __future__ import annotations

from collections.abc import Iterator

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

DESTINATION = "x-gateway-destination-endpoint"
SERVED = "x-gateway-destination-endpoint-served"
SUBSET = "x-gateway-destination-endpoint-subset"
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
ATTRIBUTES_KEY = "envoy.filters.http.ext_proc"  # where Envoy puts the requested attributes
# GIE's reference picker cuts echoed bodies below gRPC's default 64 KiB message budget
MAX_CHUNK_BYTES = 62_000


def header_pairs(headers: base_pb2.HeaderMap) -> list[tuple[bytes, bytes]]:
    """Envoy's header list as ASGI's: ``(lower-case name, value)`` byte pairs in order, the
    value as sent: ``raw_value`` (what Envoy sends), else ``value`` (a UTF-8 string by the
    protocol) encoded back to its UTF-8 bytes, so that no value, latin-1 or not, breaks a
    later step."""
    return [(h.key.lower().encode("utf-8"),
             h.raw_value if h.raw_value else h.value.encode("utf-8"))
            for h in headers.headers]


def header_map(headers: base_pb2.HeaderMap) -> dict[str, str]:
    """Envoy's header list as ``{lower-case name: value}`` (``header_pairs`` read as latin-1,
    as HTTP field bytes are; a repeated header keeps its last value)."""
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in header_pairs(headers)}


def header_values(headers: base_pb2.HeaderMap, name: str) -> list[str]:
    """Every value of header ``name`` (lower-case) in Envoy's order (``raw_value`` preferred,
    latin-1), for a header read as a list (``content-encoding``)."""
    return [h.raw_value.decode("latin-1") if h.raw_value else h.value
            for h in headers.headers if h.key.lower() == name]


def subset_hint(req: ep.ProcessingRequest) -> list[str] | None:
    """The ``ip:port`` endpoints the data plane allows (None: no hint, any of the pool)."""
    fm = req.metadata_context.filter_metadata
    if SUBSET_NAMESPACE not in fm:
        return None
    value = fm[SUBSET_NAMESPACE].fields.get(SUBSET)
    if value is None:
        return None
    if value.HasField("list_value"):
        return [v.string_value for v in value.list_value.values if v.string_value]
    if value.HasField("string_value"):
        return [s.strip() for s in value.string_value.split(",") if s.strip()]
    return []


def served_endpoint(req: ep.ProcessingRequest) -> str | None:
    """The ``ip:port`` that served the response: the protocol's metadata entry, else Envoy's
    ``upstream.address`` attribute (when the filter asks for it), else None."""
    fm = req.metadata_context.filter_metadata
    if LB_NAMESPACE in fm:
        value = fm[LB_NAMESPACE].fields.get(SERVED)
        if value is not None and value.string_value:
            return value.string_value
    attrs = req.attributes.get(ATTRIBUTES_KEY)
    if attrs is not None:
        value = attrs.fields.get("upstream.address")
        if value is not None and value.string_value:
            return value.string_value
    return None


def _mutation(set_headers: list[tuple[str, str]], remove: list[str]) -> ep.CommonResponse:
    common = ep.CommonResponse()
    for name, value in set_headers:
        opt = common.header_mutation.set_headers.add()
        opt.header.key = name
        opt.header.raw_value = value.encode("latin-1")
        opt.append_action = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
    common.header_mutation.remove_headers.extend(remove)
    return common


def _lb_metadata(destination: str) -> struct_pb2.Struct:
    meta = struct_pb2.Struct()
    meta.fields[LB_NAMESPACE].struct_value.fields[DESTINATION].string_value = destination
    return meta


def pick_headers(
    destination: str, extra: list[tuple[str, str]], body_size: int | None
) -> list[tuple[str, str]]:
    """Headers set on the upstream request: the pick, ``extra`` (e.g. the tier) and, when the
    body was rewritten, its new ``content-length``."""
    out = [(DESTINATION, destination), *extra]
    if body_size is not None:
        out.append(("content-length", str(body_size)))
    return out


def request_headers_pick(
    destination: str, extra: list[tuple[str, str]], body_size: int | None,
    remove: list[str] | None = None,
) -> ep.ProcessingResponse:
    """The answer to the request headers carrying the pick (streamed mode, or a request
    without a body): header and ``envoy.lb`` metadata with the same ``destination``;
    ``remove``: request headers dropped (``content-encoding`` of a body sent decoded)."""
    common = _mutation(pick_headers(destination, extra, body_size), remove or [])
    common.clear_route_cache = True
    return ep.ProcessingResponse(
        request_headers=ep.HeadersResponse(response=common),
        dynamic_metadata=_lb_metadata(destination),
    )


def request_body_pick(
    destination: str, extra: list[tuple[str, str]], body: bytes,
    remove: list[str] | None = None,
) -> ep.ProcessingResponse:
    """Buffered mode: the answer to the whole body carrying the pick (headers may be changed
    with a buffered body) and the body to send upstream; ``remove``: request headers
    dropped."""
    common = _mutation(pick_headers(destination, extra, len(body)), remove or [])
    common.body_mutation.body = body
    common.clear_route_cache = True
    return ep.ProcessingResponse(
        request_body=ep.BodyResponse(response=common),
        dynamic_metadata=_lb_metadata(destination),
    )


def streamed_body(
    body: bytes, end: bool = True, chunk_bytes: int = MAX_CHUNK_BYTES
) -> Iterator[ep.ProcessingResponse]:
    """Full-duplex streamed mode: ``body`` sent back as request-body responses of at most
    ``chunk_bytes`` bytes each, the last one with ``end_of_stream`` unless trailers follow
    (``end`` False); one empty chunk for an empty body."""
    n = max(1, -(-len(body) // chunk_bytes))
    for i in range(n):
        part = body[i * chunk_bytes:(i + 1) * chunk_bytes]
        common = ep.CommonResponse()
        common.body_mutation.streamed_response.body = part
        common.body_mutation.streamed_response.end_of_stream = end and i == n - 1
        yield ep.ProcessingResponse(request_body=ep.BodyResponse(response=common))


def streamed_response_body(chunk: bytes, end: bool) -> ep.ProcessingResponse:
    """Full-duplex streamed mode on the response: one response-body chunk passed on."""
    common = ep.CommonResponse()
    common.body_mutation.streamed_response.body = chunk
    common.body_mutation.streamed_response.end_of_stream = end
    return ep.ProcessingResponse(response_body=ep.BodyResponse(response=common))


def continue_request_headers() -> ep.ProcessingResponse:
    """Headers passed on unchanged (buffered mode: the pick comes with the body)."""
    return ep.ProcessingResponse(request_headers=ep.HeadersResponse())


def continue_response_headers() -> ep.ProcessingResponse:
    """Response headers passed on unchanged."""
    return ep.ProcessingResponse(response_headers=ep.HeadersResponse())


def response_headers_with(headers: list[tuple[str, str]]) -> ep.ProcessingResponse:
    """Response headers passed on with ``headers`` set (tier, replica, request id)."""
    return ep.ProcessingResponse(
        response_headers=ep.HeadersResponse(response=_mutation(headers, []))
    )


def continue_response_body() -> ep.ProcessingResponse:
    """A response body chunk (streamed or buffered mode) passed on unchanged."""
    return ep.ProcessingResponse(response_body=ep.BodyResponse())


def continue_request_trailers() -> ep.ProcessingResponse:
    """Request trailers passed on unchanged."""
    return ep.ProcessingResponse(request_trailers=ep.TrailersResponse())


def continue_response_trailers() -> ep.ProcessingResponse:
    """Response trailers passed on unchanged."""
    return ep.ProcessingResponse(response_trailers=ep.TrailersResponse())


def immediate(status: int, body: bytes, headers: list[tuple[str, str]]) -> ep.ProcessingResponse:
    """An ``ImmediateResponse``: Envoy answers the client with ``status``, ``headers`` and the
    JSON ``body`` itself, no upstream request."""
    common = _mutation([("content-type", "application/json"), *headers], [])
    return ep.ProcessingResponse(
        immediate_response=ep.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=status),
            headers=common.header_mutation,
            body=body,
            details=f"speedgate_picker_{status}",
        )
    )
