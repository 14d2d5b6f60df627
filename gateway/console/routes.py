"""The console's HTTP surface, added to the gateway's FastAPI app by ``install_console``:

- ``GET /console``: the page (``console.html``, package data: one file, inline CSS and JS,
  charts drawn as SVG by the page; no external asset, so it works offline). It holds no data
  and is served without a key; a ``Content-Security-Policy`` allows only its own inline script
  and style (by hash) and requests to this origin.
- ``GET /v1/console/state``: the JSON it polls (``gateway.console.snapshot``). With auth on it
  needs an admin API key (``Authorization: Bearer``; the page asks for it once and keeps it in
  the tab's ``sessionStorage``, never in a URL): 401 without a valid key, 403
  ``admin_required`` for a non-admin key. ``?window_s=`` narrows the summary figures. A
  document is reused for ``REUSE_S`` seconds, so many open consoles cost one build.
- ``GET /``: a browser (``Accept`` without JSON, or with HTML) is redirected (307) to
  ``/console``; a client asking for JSON gets a 404 naming the API's and console's paths.

With ``console.enabled: false`` none of these routes exist (404).
"""

from __future__ import annotations

import base64
import hashlib
import logging
import re
from importlib import resources
from typing import Any

import orjson
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from gateway.admit.audit import client_addr
from gateway.admit.auth import PermissionDenied
from gateway.admit.gate import Gate
from gateway.console.snapshot import ConsoleSources, console_snapshot
from gateway.errors import GatewayError

PAGE = "console.html"
_INLINE = re.compile(r"<(script|style)>(.*?)</\1>", re.S)
NO_STORE = {"cache-control": "no-store"}
#: Seconds a built state document is served again (several open consoles, one build): a build
#: walks every replica, pool window and active session (tens of ms with 10,000 sessions).
REUSE_S = 0.5


def load_page() -> str:
    """The console page (package data next to this module)."""
    return resources.files("gateway.console").joinpath(PAGE).read_text(encoding="utf-8")


def content_security_policy(page: str) -> str:
    """A CSP allowing exactly the page's inline ``<script>``/``<style>`` blocks (by SHA-256,
    CSP Level 2 hash sources), requests to this origin, and nothing else: no external script,
    style, image, font or frame can load."""
    hashes: dict[str, list[str]] = {"script": [], "style": []}
    for tag, body in _INLINE.findall(page):
        digest = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
        hashes[tag].append(f"'sha256-{digest}'")
    return (
        "default-src 'none'; "
        f"script-src {' '.join(hashes['script']) or chr(39) + 'none' + chr(39)}; "
        f"style-src {' '.join(hashes['style']) or chr(39) + 'none' + chr(39)}; "
        "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    )


def _error(e: GatewayError) -> Response:
    return Response(e.to_bytes(), status_code=e.status, media_type="application/json",
                    headers={**e.headers(), **NO_STORE})


def install_console(app: FastAPI, sources: ConsoleSources, gate: Gate) -> None:
    """Add ``/``, ``/console`` and ``/v1/console/state`` to ``app`` (unless disabled)."""
    if not sources.config.console.enabled:
        return
    page = load_page().encode()
    page_headers = {
        **NO_STORE,
        "content-security-policy": content_security_policy(page.decode()),
        "x-content-type-options": "nosniff",
        "referrer-policy": "no-referrer",
        "x-frame-options": "DENY",
    }
    audited: dict[str, float] = {}  # admin key id -> last audited read (monotonic s)
    cached: dict[str, Any] = {}  # the last document built: {"steps", "at", "body"}

    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def root(request: Request) -> Response:
        accept = request.headers.get("accept", "")
        if "application/json" in accept and "text/html" not in accept:
            return _error(GatewayError(
                "No API at /: the OpenAI API is under /v1 (e.g. POST /v1/chat/completions); "
                "the console is at /console.", status=404, type="invalid_request_error",
                code="not_found"))
        return RedirectResponse("/console", status_code=307)

    @app.api_route("/console", methods=["GET", "HEAD"], include_in_schema=False)
    async def console_page() -> Response:
        return Response(page, media_type="text/html; charset=utf-8", headers=page_headers)

    @app.get("/v1/console/state")
    async def console_state(request: Request, window_s: str | None = None) -> Response:
        """The console's live state (see ``gateway.console.snapshot``); admin key when auth
        is on."""
        caller = None
        try:
            caller = gate.authenticate(request.scope)
            if caller is not None and not caller.config.admin:
                raise PermissionDenied("The console needs an admin API key.",
                                       code="admin_required")
            window = _window(window_s)
        except GatewayError as e:
            if isinstance(e, PermissionDenied):
                gate.audit.event("permission_denied", code=e.code, key_id=caller and caller.id,
                                 path="/v1/console/state", client=client_addr(request.scope))
            return _error(e)
        if caller is not None:
            now = sources.clock()
            last = audited.get(caller.id)
            if last is None or now - last >= sources.recorder.window_s:
                audited[caller.id] = now
                gate.audit.event("admin_action", level=logging.INFO, action="console_read",
                                 key_id=caller.id, client=client_addr(request.scope))
        steps, now = sources.recorder.steps_for(window), sources.clock()
        if cached.get("steps") != steps or now - cached.get("at", -1e9) >= REUSE_S:
            cached.update(steps=steps, at=now, body=orjson.dumps(console_snapshot(sources, window)))
        return Response(cached["body"], media_type="application/json", headers=NO_STORE)


def _window(raw: str | None) -> float | None:
    """``?window_s=`` as seconds (> 0), or None; 400 when not a positive number."""
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise GatewayError("window_s must be a positive number of seconds", status=400,
                           type="invalid_request_error", param="window_s",
                           code="invalid_value")
    return value
