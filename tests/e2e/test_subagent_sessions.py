"""Subagents and session ends through a real stack, with the real ``anthropic`` SDK sending the
headers Claude Code sends: ``X-Claude-Code-Session-Id`` on every request, and on a subagent's
``x-claude-code-agent-id``. The subagent's turns are their own session (their own replica, not
the parent's), its usage rolls up to the parent in ``/v1/usage`` and the console's tree; and a
turn carrying ``x-speedgate-session-end: true`` ends its session."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import anthropic
import httpx
import pytest

from gateway.admit.auth import new_key
from tests.e2e.helpers import wait_for
from tests.e2e.stack import MODEL, Stack

pytestmark = pytest.mark.e2e

KEY, KEY_HASH = new_key()
ADMIN, ADMIN_HASH = new_key()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("subagents"), replicas_per_tier=4, tiers=("standard",),
              config_extra={"auth": {"keys": [{"id": "dev", "hash": KEY_HASH},
                                              {"id": "ops", "hash": ADMIN_HASH,
                                               "admin": True}]}})
    s.start()
    try:
        yield s
    finally:
        s.stop()


def _turns(client: anthropic.Anthropic, system: str, headers: dict[str, str],
           n: int) -> tuple[list[str], int]:
    """``n`` turns of one conversation; the replica of each and the tokens they used."""
    messages: list[dict] = []
    replicas, tokens = [], 0
    for i in range(n):
        messages.append({"role": "user", "content": f"step {i}: go on"})
        raw = client.messages.with_raw_response.create(
            model=MODEL, max_tokens=8, system=system, messages=messages,
            extra_headers=headers)
        msg = raw.parse()
        replicas.append(raw.headers["x-speedgate-replica"])
        u = msg.usage  # Anthropic's input_tokens leave out the cached ones
        tokens += (u.input_tokens + (u.cache_read_input_tokens or 0)
                   + (u.cache_creation_input_tokens or 0) + u.output_tokens)
        messages.append({"role": "assistant", "content": msg.content[0].text})
    return replicas, tokens


def _usage(stack: Stack, session_id: str) -> dict:
    r = httpx.get(stack.base_url + "/v1/usage", params={"session_id": session_id},
                  headers={"authorization": f"Bearer {KEY}"}, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_subagent_is_its_own_session_rolled_up_to_its_parent(stack: Stack) -> None:
    client = anthropic.Anthropic(base_url=stack.base_url, api_key=KEY, max_retries=0)
    sid = f"cc-{uuid.uuid4().hex[:8]}"
    main = {"X-Claude-Code-Session-Id": sid}
    sub = {**main, "x-claude-code-agent-id": "explore-1"}
    parent_replicas, parent_tokens = _turns(client, "You are Claude Code, the main agent.",
                                            main, 3)
    sub_replicas, sub_tokens = _turns(client, "You are a search subagent. Report back.", sub, 3)
    more_replicas, more_tokens = _turns(client, "You are Claude Code, the main agent.", main, 4)
    # each keeps its replica; the subagent was bound on its own, away from its parent's
    # (which already holds an active session): its prompt is not the parent's prefix
    assert len(set(parent_replicas + more_replicas)) == 1, parent_replicas + more_replicas
    assert len(set(sub_replicas)) == 1 and sub_replicas[0] != parent_replicas[0]

    # usage is accounted once each response is sent: wait for the last one
    assert wait_for(lambda: _usage(stack, sid)["requests"] == 10, timeout_s=10)
    doc = _usage(stack, sid)
    assert doc["own"]["requests"] == 7 and doc["requests"] == 10
    child = doc["children"][0]
    assert child["session_id"] == f"{sid}/agent/explore-1" and child["requests"] == 3
    assert child["input_tokens"] + child["output_tokens"] == sub_tokens
    assert doc["input_tokens"] + doc["output_tokens"] == parent_tokens + more_tokens + sub_tokens
    assert _usage(stack, child["session_id"])["requests"] == 3  # a session of its own too
    log = stack.log()
    assert f"session_id={sid}/agent/explore-1 session_src=claude-code-agent" in log

    state = httpx.get(stack.base_url + "/v1/console/state", timeout=10,
                      headers={"authorization": f"Bearer {ADMIN}"}).json()
    tree = next(t for t in state["sessions"]["trees"] if t["session_id"] == sid)
    assert tree["turns"] == 7 and tree["total"]["turns"] == 10
    assert [c["session_id"] for c in tree["children"]] == [child["session_id"]]


def test_the_last_turn_ends_its_session(stack: Stack) -> None:
    client = anthropic.Anthropic(base_url=stack.base_url, api_key=KEY, max_retries=0)
    sid = f"cc-{uuid.uuid4().hex[:8]}"
    _turns(client, "You are Claude Code.", {"X-Claude-Code-Session-Id": sid}, 2)
    assert _usage(stack, sid)["ended"] is None
    client.messages.create(model=MODEL, max_tokens=4,
                           messages=[{"role": "user", "content": "bye"}],
                           extra_headers={"X-Claude-Code-Session-Id": sid,
                                          "x-speedgate-session-end": "true"})
    # accounting (and so the end) runs once the response is sent: poll for it
    assert wait_for(lambda: _usage(stack, sid)["ended"] == "explicit", timeout_s=10)
    assert _usage(stack, sid)["requests"] == 3  # accounting stays

    def console_says() -> str | None:
        state = httpx.get(stack.base_url + "/v1/console/state", timeout=10,
                          headers={"authorization": f"Bearer {ADMIN}"}).json()
        return {s["session_id"]: s["ended"] for s in state["sessions"]["ended"]}.get(sid)

    assert wait_for(lambda: console_says() == "explicit", timeout_s=10)


@pytest.mark.parametrize("agent", ["codex", "opencode"])
def test_codex_and_opencode_subagents_roll_up(stack: Stack, agent: str) -> None:
    """The real ``openai`` SDK with the headers each agent sends: Codex's Responses requests
    (``session-id``, ``thread-id``, a spawned thread's ``x-codex-parent-thread-id`` and
    ``x-codex-turn-metadata``), OpenCode's chat completions to a custom provider
    (``X-Session-Id``, ``x-session-affinity``, a child's ``x-parent-session-id``)."""
    import openai

    client = openai.OpenAI(base_url=stack.base_url + "/v1", api_key=KEY, max_retries=0)
    root, child = f"{agent}-{uuid.uuid4().hex[:8]}", f"{agent}-child-{uuid.uuid4().hex[:8]}"
    if agent == "codex":
        parent_h = {"session-id": root, "thread-id": root}
        child_h = {"session-id": root, "thread-id": child, "x-codex-parent-thread-id": root,
                   "x-openai-subagent": "collab_spawn",
                   "x-codex-turn-metadata": json.dumps({"parent_thread_id": root,
                                                        "thread_source": "subagent"})}

        def turn(headers: dict[str, str]) -> None:
            client.responses.create(model=MODEL, input="go on", max_output_tokens=4,
                                    store=False, extra_headers=headers)
    else:
        parent_h = {"X-Session-Id": root, "x-session-affinity": root}
        child_h = {"X-Session-Id": child, "x-session-affinity": child,
                   "x-parent-session-id": root}

        def turn(headers: dict[str, str]) -> None:
            client.chat.completions.create(model=MODEL, max_tokens=4, extra_headers=headers,
                                           messages=[{"role": "user", "content": "go on"}])

    for headers in (parent_h, child_h, child_h, parent_h):
        turn(headers)
    assert wait_for(lambda: _usage(stack, root)["requests"] == 4, timeout_s=10)
    doc = _usage(stack, root)
    assert doc["own"]["requests"] == 2
    assert [(c["session_id"], c["requests"]) for c in doc["children"]] == [(child, 2)]
    src = "codex-thread" if agent == "codex" else "header"
    assert f"session_id={child} session_src={src}" in stack.log()
