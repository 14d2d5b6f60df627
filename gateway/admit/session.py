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

**Subagents** (``named_session``) are sessions of their own under a parent: their turns get their
own affinity (a subagent's prompt is not its parent's prefix) and their usage and budget roll up
to the parent. Each agent marks them its own way (read from the clients themselves):

- Claude Code sends its CLI session's ``X-Claude-Code-Session-Id`` on every request, the main
  agent's and its subagents' alike, and on a subagent's requests ``x-claude-code-agent-id``
  (the subagent) and, when that subagent was started by another subagent,
  ``x-claude-code-parent-agent-id``. A subagent is the session ``<session>/agent/<agent id>``
  (source ``claude-code-agent``); its parent the parent agent's such session, else the main
  session.
- Codex sends ``session-id`` (the root thread, the same for every thread of a session),
  ``thread-id`` (this thread) and, on a spawned subagent's thread, ``x-codex-parent-thread-id``
  (also ``parent_thread_id`` in the ``x-codex-turn-metadata`` JSON). A subagent is the session
  named by its ``thread-id`` (source ``codex-thread``), its parent the parent thread (the
  root thread is the request's session as the precedence names it, e.g. ``session-id``).
- OpenCode sends ``X-Session-Id`` (its session, source ``header``) and, from a subagent's
  (child) session, ``x-parent-session-id``: the parent session. Any client may send the pair.

The session that started the tree (its root: Claude Code's and Codex's session id) is kept too
when it is not the parent (a subagent of a subagent), so budgets charge both.

**Ending a session.** ``x-speedgate-session-end: true`` on a request (its last turn) ends the
session once that request is done (``session_ends``): its routing state and budget ledger are
released (``gateway.admit.session_end``), its usage totals stay readable.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.asgi import Scope
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
#: Claude Code: the subagent's id, and its parent agent's id (a subagent's subagent).
CLAUDE_AGENT = b"x-claude-code-agent-id"
CLAUDE_PARENT_AGENT = b"x-claude-code-parent-agent-id"
#: Codex: this thread, its parent thread (a spawned subagent), and the turn's JSON metadata.
CODEX_THREAD = b"thread-id"
CODEX_PARENT_THREAD = b"x-codex-parent-thread-id"
CODEX_TURN_METADATA = b"x-codex-turn-metadata"
#: OpenCode's (and anyone's) parent session of a child session.
PARENT_SESSION = b"x-parent-session-id"
#: The request header that ends its session once it is done (``true``/``1``/``yes``).
END_HEADER = b"x-speedgate-session-end"
#: Longest ``x-codex-turn-metadata`` read (bytes): more is not Codex's and is ignored.
MAX_TURN_METADATA = 16_384
#: The body field of a session (OpenAI chat completions and Responses).
CACHE_KEY_FIELD = "prompt_cache_key"


def first_values(headers: Iterable[tuple[bytes, bytes]]) -> dict[bytes, str]:
    """A header list (ASGI's: lower-case byte names, byte values) as ``name -> first value``
    decoded as latin-1 (a repeated header counts by its first value): what both edges, the
    ASGI proxy and the ext_proc picker, read a request's session from."""
    first: dict[bytes, str] = {}
    for k, v in headers:
        if k not in first:
            first[k] = v.decode("latin-1")
    return first


def header_session(scope: Scope) -> tuple[str | None, str | None]:
    """``(session id, source)`` of the first session header present and non-empty (the id
    bounded, ``bounded_id``), ``(None, None)`` when there is none."""
    return headers_session(scope["headers"])


def headers_session(
    headers: Iterable[tuple[bytes, bytes]] | Mapping[bytes, str],
) -> tuple[str | None, str | None]:
    """``header_session`` over a header list, or over ``first_values`` of one."""
    first = headers if isinstance(headers, Mapping) else first_values(headers)
    for name, source in SESSION_HEADERS:
        raw = first.get(name)
        if raw:
            return bounded_id(raw), source
    return None, None


@dataclass(frozen=True, slots=True)
class NamedSession:
    """What a request's headers say of its session: ``session_id`` and ``source`` (both None
    when no header names one), its ``parent`` session (a subagent's; None for a top-level
    session) and the tree's ``root`` when it is neither the session nor the parent."""

    session_id: str | None = None
    source: str | None = None
    parent: str | None = None
    root: str | None = None

    @property
    def ancestors(self) -> tuple[str, ...]:
        """The parent, then the root when it differs: the sessions a subagent's spend is
        also charged to."""
        return tuple(s for s in (self.parent, self.root) if s is not None)


def _codex_parent(first: Mapping[bytes, str]) -> str | None:
    """Codex's parent thread: the ``x-codex-parent-thread-id`` header, else the
    ``parent_thread_id`` of the ``x-codex-turn-metadata`` JSON (None when neither names one)."""
    parent = first.get(CODEX_PARENT_THREAD)
    if parent:
        return parent
    raw = first.get(CODEX_TURN_METADATA)
    if not raw or len(raw) > MAX_TURN_METADATA:
        return None
    try:
        meta = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser goes
        return None
    value = meta.get("parent_thread_id") if isinstance(meta, dict) else None
    return value if isinstance(value, str) and value else None


def named_session(first: Mapping[bytes, str]) -> NamedSession:
    """The session a request's headers (``first_values``) name (``headers_session``), a
    subagent's turns made their own session under their parent (module docstring). Ids
    bounded (``bounded_id``); a parent equal to the session itself is no parent."""
    sid, source = headers_session(first)
    if sid is None:
        return NamedSession()
    thread, parent_thread = first.get(CODEX_THREAD), _codex_parent(first)
    if thread and parent_thread:  # a Codex subagent; its root thread is Codex's session-id
        codex_root = first.get(b"session-id") or first.get(b"session_id")
        parent = sid if parent_thread == codex_root else bounded_id(parent_thread)
        return _tree(bounded_id(thread), "codex-thread", parent, sid)
    agent = first.get(CLAUDE_AGENT)
    if agent:
        parent_agent = first.get(CLAUDE_PARENT_AGENT)
        parent = bounded_id(f"{sid}/agent/{parent_agent}") if parent_agent else sid
        return _tree(bounded_id(f"{sid}/agent/{agent}"), "claude-code-agent", parent, sid)
    named_parent = first.get(PARENT_SESSION)
    if named_parent:
        return _tree(sid, source, bounded_id(named_parent), None)
    return NamedSession(sid, source)


def _tree(sid: str, source: str | None, parent: str, root: str | None) -> NamedSession:
    if parent == sid:
        return NamedSession(sid, source)
    return NamedSession(sid, source, parent, root if root not in (sid, parent) else None)


def session_ends(first: Mapping[bytes, str]) -> bool:
    """True when the request carries ``x-speedgate-session-end`` as ``true``, ``1`` or
    ``yes`` (any case): its session ends once it is done."""
    value = first.get(END_HEADER)
    return value is not None and value.strip().lower() in ("true", "1", "yes")


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
