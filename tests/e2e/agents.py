"""Request shapes of real coding agents, as their CLIs send them (for the agent tests).

``claude_code_body``: Claude Code's ``POST /v1/messages?beta=true`` (24 tools with
``cache_control``, ``thinking: {"type": "adaptive"}``, ``context_management``, ``output_config``,
``metadata``, ``role: "system"`` entries between the turns: agent lists, task notices, the
environment section) with its headers (``anthropic-beta``, ``X-Claude-Code-Session-Id``).
``codex_body``: Codex's ``POST /v1/responses`` (``prompt_cache_key``, ``include``, ``reasoning``,
``store: false``, function tools) with its ``session-id`` header.
"""

from __future__ import annotations

from typing import Any

from tests.e2e.stack import MODEL

CLAUDE_CODE_BETA = ("claude-code-20250219,interleaved-thinking-2025-05-14,"
                    "context-management-2025-06-27,mid-conversation-system-2026-04-07")
CACHE = {"type": "ephemeral"}


def claude_code_tools(n: int = 24) -> list[dict[str, Any]]:
    """``n`` tool definitions the way Claude Code sends them (the last with ``cache_control``)."""
    tools: list[dict[str, Any]] = [
        {"name": f"Tool{i}", "description": f"Tool number {i}: does thing {i}.",
         "input_schema": {"type": "object", "properties": {"arg": {"type": "string"}},
                          "required": ["arg"], "additionalProperties": False,
                          "$schema": "http://json-schema.org/draft-07/schema#"}}
        for i in range(n)
    ]
    tools[-1]["cache_control"] = CACHE
    return tools


def claude_code_turns(turns: int) -> list[dict[str, Any]]:
    """The ``messages`` of a Claude Code session after ``turns`` user turns: a system entry
    (agent list) before the first task, one (a background-task notice) after each answer."""
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": [{"type": "text", "text": "Available agents: explore."}]},
        {"role": "user", "content": [{"type": "text", "text": "Fix the failing test.",
                                      "cache_control": CACHE}]},
    ]
    for t in range(1, turns):
        msgs += [
            {"role": "assistant", "content": [{"type": "text", "text": f"Done step {t}."}]},
            {"role": "system", "content": f"Background task {t} finished."},
            {"role": "user", "content": f"Now step {t + 1}."},
        ]
    return msgs


def claude_code_body(turns: int = 1, *, max_tokens: int = 16, stream: bool = True,
                     session: str = "cc-session") -> dict[str, Any]:
    """The whole body of turn ``turns`` of a Claude Code session."""
    return {
        "model": MODEL,
        "messages": claude_code_turns(turns),
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1"},
                   {"type": "text", "text": "You are Claude Code.", "cache_control": CACHE}],
        "tools": claude_code_tools(),
        "metadata": {"user_id": f"user_abc_account_def_session_{session}"},
        "max_tokens": max_tokens,
        "thinking": {"type": "adaptive"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
        "stream": stream,
    }


def claude_code_headers(session: str = "cc-session") -> dict[str, str]:
    """The headers Claude Code adds to each request."""
    return {"anthropic-beta": CLAUDE_CODE_BETA, "X-Claude-Code-Session-Id": session,
            "x-app": "cli"}


def codex_body(text: str = "list the files", *, cache_key: str = "codex-thread") -> dict:
    """A Codex ``/v1/responses`` turn (``wire_api = "responses"``)."""
    return {
        "model": MODEL,
        "instructions": "You are Codex, a coding agent.",
        "input": [{"type": "message", "role": "user",
                   "content": [{"type": "input_text", "text": text}]}],
        "tools": [{"type": "function", "name": "shell", "description": "Run a command",
                   "strict": False,
                   "parameters": {"type": "object", "properties": {
                       "command": {"type": "array", "items": {"type": "string"}}},
                       "required": ["command"]}}],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": cache_key,
        "max_output_tokens": 16,
    }
