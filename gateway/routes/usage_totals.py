"""``GET /v1/usage``: the totals of one session (``session_id``, with its budget) or of one API
key (``key_id``): requests, tokens by type, cost (USD), TTFT and e2e sums (seconds). A caller
reads its own key; other keys and sessions need an admin key (audited).

A session is scoped by its API key, as budgets are: ``session_id`` with ``key_id`` is that
key's session; without ``key_id`` it is the caller's own key's session (an admin's too: an
admin names the key to read another key's session; with auth off, the one keyless scope)."""

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


def add_usage_route(app: FastAPI, state: GatewayState, gate: Gate) -> None:
    """Add ``GET /v1/usage`` (400 without ``session_id`` or ``key_id``, 403 ``admin_required``
    for another key's or a session's totals without an admin key, 503 ``state_unavailable``
    with ``retry-after: 5`` while the usage store is down)."""

    @app.get("/v1/usage")
    async def usage_totals(
        request: Request, session_id: str | None = None, key_id: str | None = None
    ) -> Response:
        """Totals of one session (``x-session-id``) or one API key id."""
        caller = None
        try:
            caller = gate.authenticate(request.scope)
            if caller is not None and not caller.config.admin and (
                key_id != caller.id or session_id is not None
            ):
                raise PermissionDenied(
                    "Reading usage of other keys or of sessions needs an admin API key.",
                    code="admin_required",
                )
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
            totals = await (store.get_session(owner, session_id) if session_id is not None
                            else store.get_key(key_id or ""))
        except UsageStoreUnavailable:
            return error_response(GatewayError("usage store unavailable", status=503,
                                               code="state_unavailable", retry_after_s=5))
        scope: dict[str, Any] = (
            {"session_id": session_id} if session_id is not None else {"key_id": key_id}
        )
        if session_id is not None:  # its budget under the same owner as its totals
            try:
                scope["budget"] = await state.admission.budgets.read(owner, session_id)
            except Exception:  # the budget store is down: the totals still answer
                scope["budget"] = None
        return json_response(200, {"object": "usage", **scope, **totals.to_dict()})
