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
6. the Responses chain's first response id (``responses_chain``): every turn of a
   ``previous_response_id`` chain is one session, named by the id of the response that
   started it (``protocols.responses.state`` finds it when it expands the chain; a first
   turn that will be stored starts a chain and is named by its own id, a ``store: false``
   one cannot be continued and falls through to 7).
7. the conversation hash (``conversation``): ``p:`` and the hash of the leading messages
   (every message through the first ``user`` one; a completion's prompt start), keyed with
   the API key's id (``gateway.routing.keys.session_key``): later turns resend the same
   leading messages, so an agent that names nothing is still one session.

Every request therefore has a session. Routing affinity follows it: a session a client named
(1-5) is routed by its id; the two the gateway derives route as they did before they were
sessions (``gateway.routing.keys.affinity_id``): a chain's later turns by its first id, its
first turn and everything else by the conversation hash (a first turn's own id would name a
replica before anything is cached on one).

A client that resends the whole conversation each turn with ``store`` left on and no session
id makes each turn its own chain, hence its own session: send ``x-session-id`` or
``prompt_cache_key`` (or ``store: false``) to keep such turns one session.

Values longer than ``MAX_ID_CHARS`` are kept as their fixed-size digest (``bounded_id``).
"""

from __future__ import annotations

from typing import Any

from gateway.asgi import Scope, header
from gateway.common.ids import bounded_id
from gateway.routing.keys import CONVERSATION, RESPONSES_CHAIN, session_key

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


def derived_session(
    chain_root: str | None, conversation: dict[str, Any], scope: str | None
) -> tuple[str, str]:
    """``(session id, source)`` of a request that names no session (sources 6 and 7): the
    Responses chain's first response id ``chain_root`` (``ParsedBody.chain_root``, set once
    the protocol expanded ``previous_response_id``; a stored first turn's own id) when there
    is one, else the conversation hash of the chat-shaped ``conversation`` keyed with
    ``scope`` (the API key's id, None on an open gateway)."""
    if chain_root:
        return bounded_id(chain_root), RESPONSES_CHAIN
    return session_key(conversation, None, scope=scope), CONVERSATION
