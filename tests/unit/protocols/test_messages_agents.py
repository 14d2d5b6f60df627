"""Claude Code's Messages bodies: ``role: "system"`` entries between the turns, fields the
gateway does not own (adaptive thinking, ``context_management``, ``output_config``,
``metadata``) accepted and forwarded untouched, earlier turns forwarded byte for byte (the
engine's prefix cache), and token counts that see system entries, tools and ``system``."""

from __future__ import annotations

import orjson
import pytest

from engines.sim.messages_api import to_chat
from gateway.protocols.messages.protocol import MessagesProtocol, parse_messages
from gateway.telemetry.tokencount import count_chat_prompt
from tests.e2e.agents import claude_code_body

MESSAGES = MessagesProtocol()


def test_claude_code_body_with_system_entries_is_accepted() -> None:
    body = parse_messages(orjson.dumps(claude_code_body(3)), need_max_tokens=True)
    roles = [m["role"] for m in body.conversation["messages"]]
    # the top-level system first, then every entry in place (two notices between the turns)
    assert roles[0] == "system" and roles.count("system") == 1 + 3
    assert roles[1:4] == ["system", "user", "assistant"]


@pytest.mark.parametrize("extra", [
    {"thinking": {"type": "adaptive"}},
    {"thinking": {"type": "some-future-kind", "x": 1}},
    {"context_management": {"edits": []}},
    {"output_config": {"effort": "max", "future": True}},
    {"metadata": {"user_id": "u"}},
    {"a_field_from_next_year": [1, 2]},
])
def test_fields_the_gateway_does_not_own_are_forwarded_untouched(extra: dict) -> None:
    raw = orjson.dumps({**claude_code_body(1), **extra})
    body = parse_messages(raw, need_max_tokens=True)
    sent = orjson.loads(MESSAGES.upstream_body(body, "served/model"))
    assert sent["model"] == "served/model"
    for k, v in extra.items():
        assert sent[k] == v


def test_turn_n_plus_1_forwarded_body_starts_with_turn_n() -> None:
    """Prefix-cache friendly: what was forwarded for turn N is, up to its last message, the
    start of what is forwarded for turn N+1 (the engine renders the same tokens again)."""
    prev: bytes | None = None
    prev_msgs = 0
    for turn in range(1, 6):
        doc = claude_code_body(turn)
        sent = MESSAGES.upstream_body(parse_messages(orjson.dumps(doc), need_max_tokens=True),
                                      "served/model")
        if prev is not None:
            # turn N's bytes through its last message (the array's closing bracket excluded)
            last = orjson.dumps(claude_code_body(turn - 1)["messages"][prev_msgs - 1])
            cut = prev.index(last) + len(last)
            assert sent[:cut] == prev[:cut]
            assert sent[cut:cut + 1] == b","  # turn N+1 goes on where turn N stopped
        prev, prev_msgs = sent, len(doc["messages"])


def test_token_estimate_sees_system_entries_tools_and_system() -> None:
    doc = claude_code_body(2)
    full = count_chat_prompt(parse_messages(orjson.dumps(doc), need_max_tokens=True)
                             .conversation)
    notice = "a long background notice " * 50
    doc["messages"].insert(3, {"role": "system", "content": notice})
    with_notice = count_chat_prompt(parse_messages(orjson.dumps(doc), need_max_tokens=True)
                                    .conversation)
    assert with_notice - full >= 200  # the entry's ~250 tokens counted
    no_tools = count_chat_prompt(parse_messages(
        orjson.dumps({**doc, "tools": []}), need_max_tokens=True).conversation)
    assert with_notice - no_tools > 24 * 20  # 24 tool definitions counted
    no_system = count_chat_prompt(parse_messages(
        orjson.dumps({k: v for k, v in doc.items() if k != "system"}), need_max_tokens=True)
        .conversation)
    assert with_notice > no_system


def test_simulator_keeps_system_entries_in_place_as_vllm_does() -> None:
    chat = to_chat(claude_code_body(2))
    roles = [m["role"] for m in chat["messages"]]
    assert roles == ["system", "system", "user", "assistant", "system", "user"]
    assert chat["messages"][4]["content"] == "Background task 1 finished."
