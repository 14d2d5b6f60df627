"""An agent's own session id is its session: one precedence list over the headers coding agents
send, then the body's ``prompt_cache_key`` (``gateway.admit.session``)."""

from __future__ import annotations

import pytest

from gateway.admit.session import body_session, header_session
from gateway.common.ids import MAX_ID_CHARS


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
