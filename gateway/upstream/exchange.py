"""The request context (``Exchange``): one request's state, built once by the handler
(``gateway.handler.ApiRoute``) and handed to every step below it (failover, continuation, the
relays, accounting) instead of long parameter lists.

It holds what the steps share and control state the steps steer by (whether the response
started, the stream's codec, the attempts to close); ``RequestRecord`` (``rec``) only records
what happened, for the access log, metrics, usage and the console. It lives in ``upstream``,
the lowest step that takes it: everything it names (the plan, the protocol and body, the
record and trace, ``StepDeps``) sits at or below that layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.plan.chain import Plan
from gateway.protocols.base import Protocol, StreamCodec
from gateway.protocols.body import ParsedBody
from gateway.telemetry.record import RequestRecord
from gateway.telemetry.tracing import RequestTrace
from gateway.upstream.attempt import OpenedResponse
from gateway.upstream.deadline import ClientTimeouts
from gateway.upstream.deps import StepDeps


@dataclass(slots=True, eq=False)
class Exchange:
    """One request on its way through the steps (module docstring).

    ``state``: the gateway's runtime (``StepDeps``; the handler's ``GatewayState``);
    ``protocol``: the client API's adapter; ``rec`` / ``trace``: its record and request span;
    ``send``: the ASGI ``send`` to the client. Set by the handler as the request advances:
    ``parsed`` (the body, once read and validated; read through ``body``), ``planned`` (the
    tier plan; through ``plan``), ``raw_size`` (bytes received), ``timeouts`` (the client's,
    from its headers, less the queue wait), ``limit_headers`` (rate-limit and admission
    headers of every answer). Filled by the steps: ``attempts`` (the opened attempt, then a
    resumed stream's continuations or a JSON answer's fresh attempt; the handler closes them
    all), ``relayed`` (content payloads sent, references: usage estimates and resume
    points), ``codecs`` (the stream's codec once it started: its in-band error events),
    ``response_doc`` (the JSON response, or the stream's final object where the protocol has
    one), ``started`` (True once the client got the response's headers: an error is then
    in-band, never a status)."""

    state: StepDeps
    protocol: Protocol
    rec: RequestRecord
    trace: RequestTrace
    send: Any
    parsed: ParsedBody | None = None
    planned: Plan | None = None
    raw_size: int = 0
    timeouts: ClientTimeouts = field(default_factory=ClientTimeouts)
    limit_headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    attempts: list[OpenedResponse] = field(default_factory=list)
    relayed: list[bytes] = field(default_factory=list)
    codecs: list[StreamCodec] = field(default_factory=list)
    response_doc: dict[str, Any] | None = None
    started: bool = False
    #: the session's in-flight mark once admitted (``SessionEnds.begin``), given back by
    #: accounting
    session_running: Any = None

    @property
    def body(self) -> ParsedBody:
        """The parsed body; ``RuntimeError`` before the handler read it (a step run too
        early)."""
        if self.parsed is None:
            raise RuntimeError("the request body is not read yet")
        return self.parsed

    @property
    def plan(self) -> Plan:
        """The tier plan; ``RuntimeError`` before the handler planned the request."""
        if self.planned is None:
            raise RuntimeError("the request is not planned yet")
        return self.planned
