"""``GET /v1/usage``: the totals of one session (``session_id``, with its budget) or of one API
key (``key_id``): requests, tokens by type, cost (USD), TTFT and e2e sums (seconds).

A session is scoped by its API key, as budgets are: ``session_id`` with ``key_id`` is that
key's session; without ``key_id`` it is the caller's own key's session (with auth off, the one
keyless scope). A session's answer is its tree (``gateway.telemetry.usage_tree``): the top-level
totals rolled up over its subagents' sessions, ``own`` its own, ``children`` each subagent's
(the same shape), ``ended`` how it ended (``explicit``, ``idle``; None while it goes on).

Any key reads its own key's totals and its own sessions; another key's session is a 404 like
an unknown one (a plain key never learns which ids another key uses), another key's totals a
403 ``admin_required``. An admin key reads any (audited).

A session id is read from its header as latin-1 (HTTP's field bytes); the query's
``session_id`` is text, percent-decoded as UTF-8, so it is looked up by its UTF-8 bytes read as
latin-1 (``header_text``): a session named ``x-session-id: sess-é`` is
``?session_id=sess-%C3%A9``."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from gateway.admit.audit import client_addr
from gateway.admit.auth import PermissionDenied
from gateway.admit.gate import Gate
from gateway.errors import GatewayError
from gateway.routes.json_answers import error_response, json_response
from gateway.state import GatewayState
from gateway.telemetry.usage_store import UsageStoreUnavailable
from gateway.telemetry.usage_tree import session_tree


def header_text(value: str) -> str:
    """A query value as the same bytes sent in a header read: its UTF-8 bytes as latin-1
    (ASCII unchanged)."""
    return value.encode("utf-8", "surrogatepass").decode("latin-1")


def session_not_found(session_id: str) -> GatewayError:
    """404 ``session_not_found`` (OpenAI's error shape): no such session of this key."""
    return GatewayError(f"No session {session_id[:200]!r} of this API key.", status=404,
                        type="invalid_request_error", code="session_not_found",
                        param="session_id")


def add_usage_route(app: FastAPI, state: GatewayState, gate: Gate) -> None:
    """Add ``GET /v1/usage`` (400 without ``session_id`` or ``key_id``, 403 ``admin_required``
    for another key's totals without an admin key, 404 ``session_not_found`` for a session
    the key (``key_id``, else the caller's) never sent, or another key's session asked by a
    plain key, 503 ``state_unavailable`` with ``retry-after: 5`` while the usage store is
    down)."""

    @app.get("/v1/usage")
    async def usage_totals(
        request: Request, session_id: str | None = None, key_id: str | None = None
    ) -> Response:
        """Totals of one session (its tree) or one API key id."""
        caller = None
        try:
            caller = gate.authenticate(request.scope)
            plain = caller is not None and not caller.config.admin
            if caller is not None and plain and session_id is None and key_id != caller.id:
                raise PermissionDenied(
                    "Reading usage of other keys needs an admin API key.",
                    code="admin_required",
                )
            if (caller is not None and plain and session_id is not None
                    and key_id not in (None, caller.id)):
                raise session_not_found(session_id)  # another key's: as if unknown
        except GatewayError as e:
            if isinstance(e, PermissionDenied):
                gate.audit.event("permission_denied", code=e.code, key_id=caller and caller.id,
                                 path="/v1/usage", client=client_addr(request.scope))
            return error_response(e)
        if caller is not None and caller.config.admin:
            gate.audit.event("admin_action", level=logging.INFO, action="read_usage",
                             key_id=caller.id, target_key_id=key_id,
                             target_session=session_id is not None,
                             client=client_addr(request.scope))
        if session_id is None and key_id is None:
            err = GatewayError("give session_id (and, for its budget, key_id) or key_id",
                               status=400, type="invalid_request_error", param="session_id")
            return error_response(err)
        store = state.usage
        # a session belongs to key_id, else to the caller's key (None with auth off)
        owner = key_id if key_id is not None else (caller.id if caller is not None else None)
        try:
            if session_id is None:
                totals = await store.get_key(key_id or "")
                return json_response(200, {"object": "usage", "key_id": key_id,
                                           **totals.to_dict()})
            tree = await session_tree(store, owner, header_text(session_id))
        except UsageStoreUnavailable:
            return error_response(GatewayError("usage store unavailable", status=503,
                                               code="state_unavailable", retry_after_s=5))
        if tree is None:
            return error_response(session_not_found(session_id))
        doc: dict[str, Any] = {"object": "usage", **tree, "session_id": session_id}
        try:  # its budget under the same owner as its totals
            doc["budget"] = await state.admission.budgets.read(owner, header_text(session_id))
        except Exception:  # the budget store is down: the totals still answer
            doc["budget"] = None
        return json_response(200, doc)
