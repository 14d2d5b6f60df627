"""Reading a request body into a checked ``ParsedBody``: the protocol's parse, the JSON shape
limits (``hardening``), the sampling parameters (``params``) and the nested shapes
(``body_schema``), in that order, so that every client mistake is a 400 before any replica.

A heavy but legal body must not stall the event loop: parsing and checking a few MiB of JSON
takes tens of ms, during which every other request waits and Redis calls on the loop overrun
their timeout (``state.redis_timeout_s``, 0.1 s by default; stalls past it opened the shared
Redis breaker). Bodies of ``OFFLOAD_PARSE_BYTES`` or more are therefore parsed in a worker
thread (``asyncio.to_thread``). The Python parts of the checks hand the GIL back to the loop's
thread every ``sys.getswitchinterval()`` (5 ms); one C call (orjson's parse, pydantic's
validation) keeps it for its whole run, so the stall shrinks rather than vanishes. Measured
(``loadtests/fuzz_front_doors.py --bench``, 2 cores under a load average of 6): an 8 MB
Messages body stalled the loop 252 ms parsed inline and 69 ms offloaded; a thread hop costs
~270 µs and parsing and checking 64 KiB ~190 µs, so below 256 KiB (~0.8 ms of work) the hop
would cost a third or more of the work it moves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from gateway.admit.body_schema import check_body_schema
from gateway.admit.hardening import check_json_shape
from gateway.admit.params import check_sampling_params
from gateway.protocols.base import Protocol
from gateway.protocols.body import ParsedBody

#: Bodies at least this large (bytes) are parsed off the event loop (module docstring).
OFFLOAD_PARSE_BYTES = 256 * 1024


def parse_checked(
    protocol: Protocol, raw: bytes, max_json_depth: int,
    on_doc: Callable[[dict[str, Any]], None] | None = None,
) -> ParsedBody:
    """``raw`` parsed by ``protocol`` and checked (module docstring); raises
    ``InvalidRequest`` (400) in the protocol's terms. ``on_doc`` sees the parsed document
    before it is checked (the access log keeps what a refused request asked for)."""
    body = protocol.parse(raw)
    if on_doc is not None:
        on_doc(body.doc)
    check_json_shape(body.doc, max_json_depth)
    if protocol.operation in ("chat", "text_completion"):
        check_sampling_params(body.doc, protocol.operation)
    check_body_schema(protocol.name, body.doc)
    return body


async def read_checked(
    protocol: Protocol, raw: bytes, max_json_depth: int,
    on_doc: Callable[[dict[str, Any]], None] | None = None,
    offload_bytes: int = OFFLOAD_PARSE_BYTES,
) -> ParsedBody:
    """``parse_checked``, in a worker thread when ``raw`` has ``offload_bytes`` or more."""
    if len(raw) >= offload_bytes:
        return await asyncio.to_thread(parse_checked, protocol, raw, max_json_depth, on_doc)
    return parse_checked(protocol, raw, max_json_depth, on_doc)
