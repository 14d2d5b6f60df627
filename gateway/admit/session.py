"""The session a request belongs to: one precedence list over what coding agents send.

A session is what routing affinity, session budgets, per-session usage totals, fair share
inside a key and the console's session table are keyed by (always within the API key: the pair
names it). Agents name their sessions themselves, each its own way; the first of these that a
request carries is its session, and the access log's ``session_src`` says which it was:

1. ``x-session-id`` header (``header``): speedgate's own, for any client.
2. ``X-Claude-Code-Session-Id`` header (``claude-code``): Claude Code, one per CLI session.
3. ``session-id`` / ``session_id`` header (``codex``): Codex CLI, one per conversation.
4. ``x-opencode-session`` header (``opencode``): OpenCode, one per session.
5. body ``prompt_cache_key`` (``prompt_cache_key``), chat completions and Responses: OpenAI's
   own key for cache routing; Codex sets it to its conversation id, OpenCode to its session
   id, the OpenAI Agents SDK and other clients where the user sets it.

Without any of these the request still routes by affinity (``gateway.routing.keys``), but has
no session for budgets, usage, fair share or the console: a Responses chain is keyed by its
first response id (``resp:<id>``, set by ``protocols.responses_state``), anything else by the
hash of its leading messages.

Values longer than ``MAX_ID_CHARS`` are kept as their fixed-size digest (``bounded_id``).
"""

from __future__ import annotations

from typing import Any

from gateway.asgi import Scope, header
from gateway.common.ids import bounded_id

#: Session headers in precedence order, with the source name each one logs.
SESSION_HEADERS: tuple[tuple[bytes, str], ...] = (
    (b"x-session-id", "header"),
    (b"x-claude-code-session-id", "claude-code"),
    (b"session-id", "codex"),
    (b"session_id", "codex"),
    (b"x-opencode-session", "opencode"),
)
#: The body field of a session (OpenAI chat completions and Responses).
CACHE_KEY_FIELD = "prompt_cache_key"


def header_session(scope: Scope) -> tuple[str | None, str | None]:
    """``(session id, source)`` of the first session header present and non-empty (the id
    bounded, ``bounded_id``), ``(None, None)`` when there is none."""
    for name, source in SESSION_HEADERS:
        raw = header(scope, name)
        if raw:
            return bounded_id(raw), source
    return None, None


def body_session(doc: dict[str, Any]) -> tuple[str | None, str | None]:
    """``(session id, "prompt_cache_key")`` of a body's non-empty string ``prompt_cache_key``,
    ``(None, None)`` otherwise (another type is the engine's to judge, not a session)."""
    value = doc.get(CACHE_KEY_FIELD)
    if isinstance(value, str) and value:
        return bounded_id(value), CACHE_KEY_FIELD
    return None, None
