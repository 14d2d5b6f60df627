"""Driving ``Picker`` without gRPC: a request's headers (a ``{name: value}`` map, ``:path``
included) and body through ``admit_head`` and ``pick``, as ``gateway.picker.stream`` does."""

from __future__ import annotations

from gateway.admit.request import ClientRequest
from gateway.picker.decide import Pick, Picker


async def decide(picker: Picker, headers: dict[str, str], body: bytes,
                 subset: list[str] | None = None) -> Pick:
    """The pick of the request with ``headers`` and ``body``; raises ``GatewayError``."""
    pairs = [(k.encode(), v.encode()) for k, v in headers.items() if not k.startswith(":")]
    request = ClientRequest.from_headers(headers.get(":path", ""), pairs)
    rec, key = picker.admit_head(request)
    return await picker.pick(request.with_body(body), key, rec, subset)
