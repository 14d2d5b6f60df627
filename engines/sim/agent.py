"""How the simulator plays an agent's model turn: whether it calls a tool or answers, with which
arguments, whether it reasons first, what structured output it writes, and scripted turns.
Pure; the chat-form request body (``engines.sim.apis``' ``to_chat``) is the input.

- after a tool result (a ``tool`` message after the conversation's last assistant message:
  an agent may append system or user notes after the result) the answer is text under the
  default policy ``text`` (so agent loops end), another call under ``call``, and under ``mix``
  a call for half the prompts, chosen by the prompt and ``--seed``;
- a request whose user message asks for a summary of the conversation (a coding agent's
  compaction: one of :data:`SUMMARY_REQUESTS`) is answered in text;
- ``tool_choice`` ``required`` or a named function always calls, ``none`` never does;
- which tool an unnamed call picks (:func:`pick_tool`): the most preferred read-only tool
  offered (:data:`READ_ONLY_TOOLS`: a call of it with generated arguments changes nothing), else the
  first tool that neither starts a subagent, asks the user, nor schedules or switches work
  (:data:`NEVER_CALLED`: a subagent's own first turn would call it again, without end; a
  non-interactive run has no one to answer), else none (a text answer);
- arguments: :func:`engines.sim.schema_values.schema_value` of the tool's ``parameters``
  (required properties only unless ``tool_arguments`` is ``all``);
- reasoning is asked by ``reasoning_effort`` (other than ``none``) or ``chat_template_kwargs``
  ``enable_thinking``/``thinking`` true; Messages ``thinking`` and Responses ``reasoning`` map to
  ``reasoning_effort`` in their ``to_chat``;
- structured output: ``response_format`` ``json_object`` (an object of words) or
  ``json_schema`` (a value of its ``schema``);
- a script (the fault field ``script``, per request or per replica) fixes the answer of each
  turn: turn *k* is the conversation's *k*-th model turn (0 = the first answer; consecutive
  assistant messages are one turn), only for requests that carry tools (an agent's side
  requests, e.g. a title, keep the generated text); turns past the script's end answer text,
  and so does a request with a user message that contains one of the fault's
  ``script_text_when`` phrases (a coding agent's compaction: the request asking for a summary,
  and the conversation continued from it, are answered as a model would, in words).
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from engines.sim.schema_values import schema_value

AfterToolResult = Literal["text", "call", "mix"]
ToolArguments = Literal["required", "all"]
REASONING_TOKENS = 12  # reasoning tokens before the answer when a request asks for reasoning


class ScriptTurn(BaseModel):
    """One scripted model turn: ``text`` (the answer, or the text before the call), ``tool`` +
    ``arguments`` (a call of that tool; ``arguments`` an object or its JSON text);
    ``reset_after_chunks``: the replica aborts the connection after that many content events
    of this turn's answer, its reasoning not counted (the fault of that name, for this turn
    only; not for a continuation of it,
    ``continue_final_message``), so a test can break one turn of an agent's run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str | None = Field(None, description="answer text (before the call when tool is set)")
    tool: str | None = Field(None, description="name of the tool to call")
    arguments: dict[str, Any] | str | None = Field(None, description="the call's arguments")
    reset_after_chunks: int | None = Field(
        None, ge=0, description="abort TCP after N content events of this turn (not of its "
        "continuation)")

    def arguments_json(self) -> str:
        """The call's arguments as JSON text (``{}`` when unset)."""
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments or {}, ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class TurnPolicy:
    """A replica's agent-turn settings: ``after_tool_result`` (``text`` | ``call`` | ``mix``),
    ``tool_arguments`` (``required`` | ``all`` properties), ``seed`` (mixes the choices)."""

    after_tool_result: AfterToolResult = "text"
    tool_arguments: ToolArguments = "required"
    seed: int = 0


def mix(key: int, label: str) -> int:
    """A derived 32-bit key: CRC32 of ``label`` seeded with ``key``."""
    return zlib.crc32(label.encode(), key & 0xFFFFFFFF)


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    msgs = body.get("messages")
    return [m for m in msgs if isinstance(m, dict)] if isinstance(msgs, list) else []


#: tool names (lower case) an unscripted call prefers, most preferred first: they only read
#: (Claude Code's ``Read``, OpenCode's ``read``, Codex's ``view_image``), so generated
#: arguments do no harm (a missing file is an error the agent reports back); ``glob`` and
#: ``grep`` last, as OpenCode runs them with ripgrep, which it may have to download first
READ_ONLY_TOOLS = ("read", "read_file", "view_image", "ls", "list", "list_dir", "glob", "grep")
#: parts of tool names (lower case) an unscripted call never picks: subagents (Claude Code's
#: ``Agent``, ``SendMessage``, ``Workflow``; Codex's ``multi_agent_v1``), questions to the user
#: (``AskUserQuestion``, OpenCode's ``question``, Codex's ``request_user_input``), mode and
#: worktree switches, scheduled turns (``ScheduleWakeup``, ``CronCreate``); OpenCode's and
#: older Claude Code's subagent tool is ``task``/``Task`` (matched whole: ``TaskList`` only reads)
NEVER_CALLED = ("agent", "question", "user_input", "planmode", "worktree", "workflow",
                "wakeup", "cron", "sendmessage")
#: phrases of the coding agents' compaction requests (read from the requests they send):
#: Claude Code's summary request, Codex's compaction prompt
SUMMARY_REQUESTS = ("Respond with plain text only", "CONTEXT CHECKPOINT COMPACTION")


def after_tool_result(body: dict[str, Any]) -> bool:
    """True when a tool result follows the conversation's last assistant message (an agent
    may append system or user notes after the result)."""
    for m in reversed(_messages(body)):
        role = m.get("role")
        if role == "tool":
            return True
        if role == "assistant":
            return False
    return False


def pick_tool(names: list[str]) -> str | None:
    """The tool an unnamed call picks among ``names`` (the request's, in order): the most
    preferred of :data:`READ_ONLY_TOOLS` offered, else the first matching no part of
    :data:`NEVER_CALLED` (nor named ``task``), else None."""
    by_name = {name.lower(): name for name in reversed(names)}
    for low in READ_ONLY_TOOLS:
        if low in by_name:
            return by_name[low]
    for name in names:
        low = name.lower()
        if low != "task" and not any(part in low for part in NEVER_CALLED):
            return name
    return None


def asks_for_summary(body: dict[str, Any]) -> bool:
    """True when a user message holds one of :data:`SUMMARY_REQUESTS`."""
    return any(p in t for t in user_texts(body) for p in SUMMARY_REQUESTS)


def turn_index(body: dict[str, Any]) -> int:
    """How many model turns the conversation already holds (runs of assistant messages)."""
    turns, prev = 0, None
    for m in _messages(body):
        role = m.get("role")
        if role == "assistant" and prev != "assistant":
            turns += 1
        prev = role
    return turns


def tool_names(body: dict[str, Any]) -> list[str]:
    """Names of the request's function tools, in order."""
    out = []
    for t in body.get("tools") or ():
        fn = t.get("function") if isinstance(t, dict) else None
        if isinstance(fn, dict) and fn.get("name"):
            out.append(str(fn["name"]))
    return out


def tool_to_call(body: dict[str, Any], policy: TurnPolicy, key: int) -> str | None:
    """Name of the tool this turn calls, or None for a text answer (module docstring)."""
    names = tool_names(body) if isinstance(body.get("tools"), list) else []
    choice = body.get("tool_choice")
    if not body.get("tools") or choice == "none":
        return None
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        if name:
            return str(name)
    first = pick_tool(names) if names else "tool"
    if choice == "required":
        return first or names[0]
    if asks_for_summary(body):
        return None
    if not after_tool_result(body) or policy.after_tool_result == "call":
        return first
    if policy.after_tool_result == "mix" and mix(key ^ policy.seed, "after-tool") % 2:
        return first
    return None


def tool_parameters(body: dict[str, Any], name: str) -> Any:
    """The JSON-schema ``parameters`` of tool ``name`` in the request (``{}`` if absent)."""
    for t in body.get("tools") or ():
        fn = t.get("function") if isinstance(t, dict) else None
        if isinstance(fn, dict) and fn.get("name") == name:
            return fn.get("parameters") or {}
    return {}


def tool_arguments(body: dict[str, Any], name: str, policy: TurnPolicy, key: int) -> str:
    """JSON arguments for a call of ``name``, valid against its ``parameters``."""
    value = schema_value(tool_parameters(body, name), mix(key ^ policy.seed, name),
                         all_properties=policy.tool_arguments == "all")
    return json.dumps(value if isinstance(value, dict) else {}, ensure_ascii=False)


def wants_reasoning(body: dict[str, Any]) -> bool:
    """True when the (chat-form) request asks for reasoning output (module docstring)."""
    effort = body.get("reasoning_effort")
    if isinstance(effort, str) and effort != "none":
        return True
    kwargs = body.get("chat_template_kwargs")
    return isinstance(kwargs, dict) and bool(kwargs.get("enable_thinking") or
                                             kwargs.get("thinking"))


def structured_output(body: dict[str, Any], policy: TurnPolicy, key: int) -> str | None:
    """The JSON text a ``response_format`` of type ``json_object``/``json_schema`` asks for
    (valid against the schema), or None when the request asks for plain text."""
    fmt = body.get("response_format")
    if not isinstance(fmt, dict):
        return None
    kind = fmt.get("type")
    k = mix(key ^ policy.seed, "structured")
    if kind == "json_object":
        return json.dumps({"answer": schema_value({"type": "string"}, k)})
    if kind != "json_schema":
        return None
    spec = fmt.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    value = schema_value(schema if isinstance(schema, dict) else {"type": "object"}, k,
                         all_properties=policy.tool_arguments == "all")
    return json.dumps(value, ensure_ascii=False)


def user_texts(body: dict[str, Any]) -> list[str]:
    """The text of every ``user`` message of a chat-form body (string content, and the
    ``text`` of its content parts)."""
    out = []
    for m in _messages(body):
        if m.get("role") != "user":
            continue
        content = m.get("content")
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            out += [str(p.get("text")) for p in content if isinstance(p, dict) and p.get("text")]
    return out


def script_turn(script: list[ScriptTurn] | None, body: dict[str, Any],
                text_when: list[str] | None = None) -> ScriptTurn | None:
    """The scripted answer for this request (module docstring), or None (no script, or no
    tools). Past the script's end, or with a user message containing a ``text_when`` phrase:
    ``ScriptTurn()`` (every field None), a generated text answer."""
    if not script or not body.get("tools"):
        return None
    if text_when and any(p in t for t in user_texts(body) for p in text_when):
        return ScriptTurn()
    k = turn_index(body)
    return script[k] if k < len(script) else ScriptTurn()
