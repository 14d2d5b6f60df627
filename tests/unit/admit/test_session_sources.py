"""An agent's own session id is its session: one precedence list over the headers coding agents
send, then the body's ``prompt_cache_key``, then the Responses chain's first id, then the
conversation hash (``gateway.admit.session``); routing affinity of the derived two unchanged."""

from __future__ import annotations

import pytest

from gateway.admit.session import body_session, derived_session, header_session
from gateway.common.ids import MAX_ID_CHARS
from gateway.routing.keys import affinity_id, session_key


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
