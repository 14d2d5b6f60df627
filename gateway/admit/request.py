"""The client's request as both edges hand it to admission: one value, read once.

Each edge (the ASGI proxy, ``gateway.handler``; the ext_proc picker, ``gateway.picker``) reads
its own transport (an ASGI scope and ``receive``; Envoy's header map and body chunks) into one
``ClientRequest``: its headers first (``from_headers``, enough to check the key before a body
byte is kept), then its body (``with_body``, decoded from any ``Content-Encoding``). Everything
admission reads comes from it (``gateway.admit.path.admit_and_plan``), never from the
transport: the credentials, the hints (tier, priority band, session budget, timeouts), the
session the headers name and the body with its size.

Header lists are ASGI's: lower-case byte names, values as sent (bytes); a repeated header
counts by its first value; values are read as latin-1, as HTTP/1.1 defines its field bytes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from gateway.admit.budget import HEADER as BUDGET_HEADER
from gateway.admit.flow.bands import HEADER as PRIORITY_HEADER
from gateway.admit.session import NamedSession, first_values, named_session, session_ends
from gateway.asgi import Scope, checked_request_id
from gateway.telemetry.record import MAX_ASKED_CHARS, RequestRecord
from gateway.upstream.deadline import ClientTimeouts, client_timeouts

#: A request whose headers name no session.
NO_SESSION = NamedSession()

_HINTS = {
    b"authorization": "authorization",
    b"x-api-key": "api_key",
    b"x-speedgate-tier": "tier",
    PRIORITY_HEADER.encode(): "priority",
    BUDGET_HEADER.encode(): "budget",
    b"x-speedgate-timeout": "timeout",
    b"x-stainless-timeout": "sdk_timeout",
    b"x-stainless-read-timeout": "sdk_read_timeout",
}


@dataclass(frozen=True, slots=True)
class ClientRequest:
    """One client request as admission reads it.

    ``path``: the API path as the edge routes by it; ``request_id``: the client's sane
    ``x-request-id`` or a fresh one (``gateway.asgi.checked_request_id``); ``client``: the
    peer's ``host:port`` for the audit log (None when unknown). Credentials:
    ``authorization`` (``Bearer``, OpenAI's SDKs) and ``api_key`` (``x-api-key``,
    Anthropic's). Hints: ``tier`` (``x-speedgate-tier``), ``priority``
    (``x-speedgate-priority``), ``budget`` (``x-speedgate-session-budget-usd``) and the three
    timeout headers (``timeouts``). ``session_id`` / ``session_src``: the session its headers
    name (``gateway.admit.session``; None when none does). ``body``: the decoded body (empty
    until ``with_body``)."""

    path: str
    request_id: str
    client: str | None = None
    authorization: str | None = None
    api_key: str | None = None
    tier: str | None = None
    priority: str | None = None
    budget: str | None = None
    timeout: str | None = None
    sdk_timeout: str | None = None
    sdk_read_timeout: str | None = None
    named: NamedSession = NO_SESSION
    session_end: bool = False
    body: bytes = b""

    @classmethod
    def from_headers(
        cls, path: str, headers: Iterable[tuple[bytes, bytes]], client: str | None = None,
        request_id: str | None = None,
    ) -> ClientRequest:
        """The request of ``headers`` (module docstring) on ``path``; ``request_id``: one the
        edge already settled on (else read from ``x-request-id``)."""
        first = first_values(headers)
        found = {name: first[k] for k, name in _HINTS.items() if k in first}
        rid = first.get(b"x-request-id")
        get = found.get
        return cls(path=path,
                   request_id=request_id or checked_request_id(
                       rid.encode("latin-1") if rid is not None else None), client=client,
                   authorization=get("authorization"), api_key=get("api_key"),
                   tier=get("tier"), priority=get("priority"), budget=get("budget"),
                   timeout=get("timeout"), sdk_timeout=get("sdk_timeout"),
                   sdk_read_timeout=get("sdk_read_timeout"), named=named_session(first),
                   session_end=session_ends(first))

    @classmethod
    def from_scope(cls, scope: Scope) -> ClientRequest:
        """The request of an ASGI HTTP ``scope`` (its request id as the app settled it,
        ``speedgate.request_id``)."""
        peer = scope.get("client")
        return cls.from_headers(scope.get("path", ""), scope["headers"],
                                client=f"{peer[0]}:{peer[1]}" if peer else None,
                                request_id=scope.get("speedgate.request_id") or None)

    @property
    def session_id(self) -> str | None:
        """The session its headers name (None when none does)."""
        return self.named.session_id

    @property
    def session_src(self) -> str | None:
        """Where ``session_id`` came from (the source name the access log shows)."""
        return self.named.source

    def name(self, rec: RequestRecord) -> None:
        """Put what the headers say of the request on its record before anything else is
        read: its session (``session_id``, ``session_src``, ``parent_session_id``,
        ``root_session_id``), whether it ends the session (``session_end``) and the tier it
        asks for (``client_tier``, kept for the access log of a refused request)."""
        named = self.named
        rec.session_id, rec.session_src = named.session_id, named.source
        rec.parent_session_id, rec.root_session_id = named.parent, named.root
        rec.session_end = self.session_end
        rec.client_tier = self.tier[:MAX_ASKED_CHARS] if self.tier else None

    def with_body(self, body: bytes) -> ClientRequest:
        """This request with its (decoded) ``body``."""
        return replace(self, body=body)

    @property
    def size(self) -> int:
        """The decoded body's size in bytes."""
        return len(self.body)

    def timeouts(self) -> ClientTimeouts:
        """The client's timeouts from its headers (``gateway.upstream.deadline``); raises
        ``InvalidRequest`` (400) for a bad ``x-speedgate-timeout``."""
        return client_timeouts(self.timeout, self.sdk_timeout, self.sdk_read_timeout)
