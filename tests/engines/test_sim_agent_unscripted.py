"""The simulator's unscripted agent turns, fed the requests real coding agents send: a
read-only tool first, with arguments valid against its schema, then text; never a tool that
starts a subagent or asks the user (a subagent's own first turn would call it again, without
end); a compaction request answered in text.

``data/agent_requests.json``: per agent (Claude Code 2.1.332 and 2.1.197 on Messages, Codex
0.171.0 on Responses, OpenCode 1.18.33 on chat completions), its first request of "create
hello.py printing hi and run it" and the request after its tool's result, as the demo's
replicas received them (long texts cut to 300 characters, the tools' descriptions dropped).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from engines.sim.agent import (
    NEVER_CALLED,
    TurnPolicy,
    after_tool_result,
    pick_tool,
    tool_arguments,
    tool_parameters,
    tool_to_call,
)
from engines.sim.apis import CHAT, MESSAGES, RESPONSES

REQUESTS = json.loads((Path(__file__).parent / "data" / "agent_requests.json").read_text())
TO_CHAT = {"messages": MESSAGES.to_chat, "responses": RESPONSES.to_chat, "chat": CHAT.to_chat}
#: the read-only tool each agent's first unscripted turn calls
FIRST_TOOL = {"claude-code-2.1.332": "Read", "claude-code-2.1.197": "Read",
              "codex-0.171.0": "view_image", "opencode-1.18.33": "read"}
#: Claude Code's summary request (its compaction), as it ends
SUMMARY = ("Your task is to create a detailed summary of the conversation so far. "
           "Respond with plain text only.")


def _chat(agent: str, which: str) -> dict[str, Any]:
    return TO_CHAT[REQUESTS[agent]["api"]](REQUESTS[agent][which])


def _never(name: str) -> bool:
    return name.lower() == "task" or any(part in name.lower() for part in NEVER_CALLED)


@pytest.mark.parametrize("agent", sorted(REQUESTS))
def test_first_turn_calls_a_read_only_tool_with_valid_arguments(agent: str) -> None:
    """Each agent's first request: a call of its read-only tool (Claude Code's tools list
    starts with ``Agent``, OpenCode's holds ``task``, Codex's ``multi_agent_v1`` and
    ``request_user_input``), arguments valid against that tool's schema."""
    body = _chat(agent, "first")
    for key in range(20):
        name = tool_to_call(body, TurnPolicy(), key)
        assert name == FIRST_TOOL[agent]
        args = json.loads(tool_arguments(body, name, TurnPolicy(), key))
        jsonschema.validate(args, tool_parameters(body, name))


@pytest.mark.parametrize("agent", sorted(REQUESTS))
def test_after_the_tool_result_the_answer_is_text(agent: str) -> None:
    """The request after the tool's result is answered in text, so the run ends."""
    body = _chat(agent, "after_tool_result")
    assert after_tool_result(body)
    assert all(tool_to_call(body, TurnPolicy(), key) is None for key in range(20))


@pytest.mark.parametrize("agent", sorted(REQUESTS))
def test_no_policy_calls_a_subagent_or_asks_the_user(agent: str) -> None:
    """Whatever the policy (a call after every result, a mix) or ``tool_choice: required``,
    a call picks no subagent, question, mode switch or scheduled turn."""
    for which in ("first", "after_tool_result"):
        body = _chat(agent, which)
        for policy in (TurnPolicy("call"), TurnPolicy("mix", seed=5)):
            for key in range(20):
                name = tool_to_call(body, policy, key)
                assert name is None or not _never(name), name
        name = tool_to_call({**body, "tool_choice": "required"}, TurnPolicy(), 0)
        assert name is not None and not _never(name), name


def test_a_note_after_the_tool_result_still_ends_the_turn() -> None:
    """Claude Code may add ``system`` entries (and text beside the ``tool_result``) after a
    result: the turn is still one after a tool result, answered in text."""
    raw = REQUESTS["claude-code-2.1.332"]["after_tool_result"]
    last = raw["messages"][-1]
    noted = {**raw, "messages": [
        *raw["messages"][:-1],
        {**last, "content": [*last["content"], {"type": "text", "text": "<reminder>"}]},
        {"role": "system", "content": "A background task finished."}]}
    body = MESSAGES.to_chat(noted)
    assert body["messages"][-1]["role"] != "tool"
    assert tool_to_call(body, TurnPolicy(), 0) is None


def test_a_summary_request_is_answered_in_text() -> None:
    """Claude Code's compaction (its tools still offered) is answered in words, not a call."""
    raw = REQUESTS["claude-code-2.1.332"]["first"]
    body = MESSAGES.to_chat({**raw, "messages": [
        *raw["messages"], {"role": "user", "content": SUMMARY}]})
    assert all(tool_to_call(body, TurnPolicy(), key) is None for key in range(20))
    assert tool_to_call({**body, "tool_choice": "required"}, TurnPolicy(), 0) == "Read"


def test_pick_tool_order() -> None:
    """Read-only first (``read`` over ``glob``, whatever the offered order), else the first
    tool that is safe to call, else none; ``TaskList`` only reads, ``task`` spawns."""
    assert pick_tool(["Agent", "Glob", "Bash", "Read"]) == "Read"
    assert pick_tool(["Agent", "Bash", "Write"]) == "Bash"
    assert pick_tool(["task", "question", "TaskList"]) == "TaskList"
    assert pick_tool(["Agent", "AskUserQuestion", "task", "request_user_input",
                      "multi_agent_v1", "ExitPlanMode", "EnterWorktree", "ScheduleWakeup",
                      "CronCreate", "SendMessage", "Workflow"]) is None
    assert pick_tool(["write", "other"]) == "write"
