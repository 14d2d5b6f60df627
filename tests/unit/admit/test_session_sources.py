"""An agent's own session id is its session: one precedence list over the headers coding agents
send, then the body's ``prompt_cache_key``, then the Responses chain's first id, then the
conversation hash (``gateway.admit.session``); routing affinity of the derived two unchanged."""

from __future__ import annotations

import pytest

from gateway.admit.request import ClientRequest
from gateway.admit.session import (
    NamedSession,
    body_session,
    derived_session,
    first_values,
    header_session,
    headers_session,
    named_session,
    session_ends,
)
from gateway.common.ids import MAX_ID_CHARS
from gateway.routing.keys import affinity_id, session_key
from gateway.telemetry.record import RequestRecord


def scope(**headers: str) -> dict:
    return {"headers": [(k.replace("_h_", "-").encode(), v.encode()) for k, v in headers.items()]}


@pytest.mark.parametrize(("headers", "want"), [
    ({}, (None, None)),
    ({"x_h_session_h_id": "mine", "x_h_claude_h_code_h_session_h_id": "cc"}, ("mine", "header")),
    ({"x_h_claude_h_code_h_session_h_id": "cc", "session_h_id": "cx"}, ("cc", "claude-code")),
    ({"session_h_id": "cx", "x_h_opencode_h_session": "oc"}, ("cx", "codex")),
    ({"session_id": "cx2"}, ("cx2", "codex")),
    ({"x_h_opencode_h_session": "oc"}, ("oc", "opencode")),
    ({"x_h_session_h_id": "", "session_h_id": "cx"}, ("cx", "codex")),  # empty: not a session
])
def test_header_precedence(headers: dict, want: tuple) -> None:
    assert header_session(scope(**headers)) == want


def test_long_ids_are_bounded() -> None:
    sid, src = header_session(scope(x_h_claude_h_code_h_session_h_id="x" * 5000))
    assert src == "claude-code" and sid is not None and len(sid) <= MAX_ID_CHARS


@pytest.mark.parametrize(("doc", "want"), [
    ({"prompt_cache_key": "thread-1"}, ("thread-1", "prompt_cache_key")),
    ({"prompt_cache_key": ""}, (None, None)),
    ({"prompt_cache_key": 5}, (None, None)),
    ({}, (None, None)),
])
def test_prompt_cache_key(doc: dict, want: tuple) -> None:
    assert body_session(doc) == want


LEAD = {"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]}
LATER = {"messages": [*LEAD["messages"], {"role": "assistant", "content": "ok"},
                      {"role": "user", "content": "next"}]}


def test_a_chain_is_named_by_its_first_response_id() -> None:
    assert derived_session("resp_first", LEAD, "k") == ("resp_first", "responses_chain")
    assert derived_session("x" * 5000, LEAD, "k")[0] != "x" * 5000  # bounded


def test_the_conversation_hash_is_the_session_scoped_to_the_key() -> None:
    sid, src = derived_session(None, LEAD, "k")
    assert src == "conversation" and sid == session_key(LEAD, None, scope="k")
    assert derived_session(None, LATER, "k")[0] == sid  # later turns: the same leading messages
    assert derived_session(None, LEAD, "other-key")[0] != sid  # tenants never share one


@pytest.mark.parametrize(("session", "source", "hint", "want"), [
    ("mine", "header", None, "mine"),  # a named session routes by its id
    ("pck", "prompt_cache_key", "resp:resp_1", "pck"),
    ("resp_1", "responses_chain", "resp:resp_1", "resp:resp_1"),  # a chain: as before
    ("resp_0", "responses_chain", None, None),  # its first turn: the conversation hash
    ("p:abc", "conversation", None, None),  # routing hashes the conversation itself
    (None, None, "resp:resp_1", "resp:resp_1"),
])
def test_affinity_of_each_source(session: str | None, source: str | None, hint: str | None,
                                 want: str | None) -> None:
    assert affinity_id(session, source, hint) == want


# -- subagents: their own sessions under their parent (headers as each client sends them) ----

def hdrs(**headers: str) -> dict[bytes, str]:
    """Real header names (``-`` spelled as given, values as is) as the edges read them
    (``first_values``)."""
    return first_values([(k.lower().encode(), v.encode()) for k, v in headers.items()])


CC = "X-Claude-Code-Session-Id"


@pytest.mark.parametrize(("headers", "want"), [
    # Claude Code's main agent: its CLI session, no agent headers
    ({CC: "s1"}, NamedSession("s1", "claude-code")),
    # a subagent the main agent started: agent id only, the CLI session unchanged
    ({CC: "s1", "x-claude-code-agent-id": "a1"},
     NamedSession("s1/agent/a1", "claude-code-agent", "s1")),
    # a subagent's subagent: its parent is the other subagent, the CLI session its root
    ({CC: "s1", "x-claude-code-agent-id": "a2", "x-claude-code-parent-agent-id": "a1"},
     NamedSession("s1/agent/a2", "claude-code-agent", "s1/agent/a1", "s1")),
    # Codex's root thread: session-id (= its thread-id), no parent
    ({"session-id": "t0", "thread-id": "t0"}, NamedSession("t0", "codex")),
    # a spawned Codex subagent: its thread under the parent thread (header)
    ({"session-id": "t0", "thread-id": "t1", "x-codex-parent-thread-id": "t0",
      "x-openai-subagent": "collab_spawn"}, NamedSession("t1", "codex-thread", "t0")),
    # ... or named only in the turn metadata; a grandchild keeps the root
    ({"session-id": "t0", "thread-id": "t2",
      "x-codex-turn-metadata": '{"parent_thread_id": "t1", "thread_source": "subagent"}'},
     NamedSession("t2", "codex-thread", "t1", "t0")),
    # metadata that is not JSON, or names no parent: the Codex session as before
    ({"session-id": "t0", "thread-id": "t1", "x-codex-turn-metadata": "{not json"},
     NamedSession("t0", "codex")),
    ({"session-id": "t0", "thread-id": "t1", "x-codex-turn-metadata": '{"turn_id": "u"}'},
     NamedSession("t0", "codex")),
    # a user's x-session-id over Codex: the root thread maps to it
    ({"x-session-id": "mine", "session-id": "t0", "thread-id": "t1",
      "x-codex-parent-thread-id": "t0"}, NamedSession("t1", "codex-thread", "mine")),
    # OpenCode to a custom provider: X-Session-Id, and x-parent-session-id from a child
    ({"X-Session-Id": "ses_b", "x-session-affinity": "ses_b", "x-parent-session-id": "ses_a"},
     NamedSession("ses_b", "header", "ses_a")),
    ({"X-Session-Id": "ses_a", "x-session-affinity": "ses_a"}, NamedSession("ses_a", "header")),
    # a parent naming the session itself is no parent; no session named: no parent either
    ({"X-Session-Id": "ses_a", "x-parent-session-id": "ses_a"}, NamedSession("ses_a", "header")),
    ({"x-parent-session-id": "ses_a", "x-claude-code-agent-id": "a1"}, NamedSession()),
])
def test_subagent_precedence(headers: dict, want: NamedSession) -> None:
    assert named_session(hdrs(**headers)) == want


def test_subagent_ids_are_bounded_and_ancestors_listed() -> None:
    got = named_session(hdrs(**{CC: "s" * 300, "x-claude-code-agent-id": "a1"}))
    assert got.session_id is not None and len(got.session_id) <= MAX_ID_CHARS
    assert got.parent == headers_session(hdrs(**{CC: "s" * 300}))[0]
    deep = named_session(hdrs(**{CC: "s1", "x-claude-code-agent-id": "a2",
                                 "x-claude-code-parent-agent-id": "a1"}))
    assert deep.ancestors == ("s1/agent/a1", "s1")


@pytest.mark.parametrize("meta", ["[" * 5000, '{"a":' * 3000, '{"parent_thread_id": 5}', "null"])
def test_codex_turn_metadata_that_is_not_an_object_names_no_parent(meta: str) -> None:
    """``x-codex-turn-metadata`` nested past the JSON parser's depth (5,000 bytes, well under
    the header limit) is no metadata: the thread is no subagent. It raised RecursionError,
    which the proxy answered 500."""
    got = named_session(hdrs(**{"session-id": "root", "thread-id": "t",
                                "x-codex-turn-metadata": meta}))
    assert got == NamedSession("root", "codex")


@pytest.mark.parametrize(("value", "ends"), [
    ("true", True), ("TRUE", True), ("1", True), ("yes", True), (" true ", True),
    ("false", False), ("0", False), ("", False), (None, False),
])
def test_session_end_header(value: str | None, ends: bool) -> None:
    headers = {"x-session-id": "s"} | ({"x-speedgate-session-end": value} if value is not None
                                       else {})
    assert session_ends(hdrs(**headers)) is ends


def test_name_request_fills_the_record() -> None:
    rec = RequestRecord("r1", "/v1/messages")
    ClientRequest.from_headers("/v1/messages", [(k.lower().encode(), v.encode()) for k, v in {
        CC: "s1", "x-claude-code-agent-id": "a1", "x-speedgate-session-end": "true",
        "x-speedgate-tier": "fast"}.items()]).name(rec)
    assert (rec.session_id, rec.session_src, rec.parent_session_id, rec.root_session_id) == (
        "s1/agent/a1", "claude-code-agent", "s1", None)
    assert rec.session_end and rec.client_tier == "fast"
