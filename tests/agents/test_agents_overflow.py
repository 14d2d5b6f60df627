"""Each agent driven past a small context limit ends: it compacts and goes on, or stops with a
clear message; none loops.

The stack is the demo with replicas of 65,536 tokens (``speedgate demo --max-model-len``):
small beside the demo's default, and still above each agent's fixed output cap plus its first
prompt (OpenCode always asks ``max_tokens`` 32,000; under a limit that leaves no room beside
that cap it can only compact, again and again). The scripted model runs the agent's shell tool
``GROWTH_TURNS`` times, each printing 4,000 words, so the conversation passes the limit within
the run. Requests that ask for a summary, and the conversation continued from one
(``script_text_when``: each agent's own phrases, read from the requests they send), are
answered in words, as a model would.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agents.demo_stack import demo_stack
from tests.agents.harness import (
    access_lines,
    run_claude,
    run_codex,
    run_opencode,
    set_replica_faults,
)
from tests.agents.install import Agents
from tests.e2e.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
MAX_MODEL_LEN = 65536
GROWTH_TURNS = 45  # Codex keeps ~2k tokens of each output: 45 turns pass 65,536 for all
WORDS = "python3 -c \"print('word ' * 4000)\""
#: per agent: its shell tool and its argument; the phrases of its compaction requests
SHELL = {"claude": ("Bash", "command"), "codex": ("exec_command", "cmd"),
         "opencode": ("bash", "command")}
COMPACTION = {
    # Claude Code's summary request, and its conversation continued from the summary
    "claude": ["Respond with plain text only", "continued from a previous conversation"],
    # OpenCode's message after its compaction (its summary request carries no tools)
    "opencode": ["Continue if you have next steps"],
    "codex": [],
}


def _small_demo(tmp_path_factory: pytest.TempPathFactory, tokens: int) -> Iterator[Stack]:
    """The demo with replicas of ``tokens`` tokens, one per tier (stopped afterwards)."""
    s = demo_stack(tmp_path_factory.mktemp(f"demo{tokens}"), "--max-model-len", str(tokens),
                   "--replicas", "1")
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def small_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The demo with replicas of ``MAX_MODEL_LEN`` tokens, one per tier."""
    yield from _small_demo(tmp_path_factory, MAX_MODEL_LEN)


def _script(agent: str) -> list[dict[str, Any]]:
    tool, arg = SHELL[agent.removesuffix("-node20")]
    extra = {} if agent == "codex" else {"description": "Print words"}
    return [{"tool": tool, "arguments": {arg: WORDS, **extra}}] * GROWTH_TURNS + [
        {"text": "Done printing."}]


def _compaction_seen(stack: Stack, phrases: list[str]) -> bool:
    """True when a request the replicas received holds one of the compaction ``phrases``."""
    return any(p in str((r.get("body") or {}).get("messages") or (r.get("body") or {}).get("input"))
               for r in stack.sim_requests() for p in phrases)


@pytest.mark.parametrize("agent", ["claude", "claude-node20", "codex", "opencode"])
def test_past_the_context_limit_the_agent_ends(agent: str, agents: Agents, small_stack: Stack,
                                               tmp_path: Path) -> None:
    """The run ends well before its timeout with a bounded number of requests and refusals
    (no loop), and either compacted (its compaction request reached a replica) or stopped
    with a message about the context window."""
    scratch, home = tmp_path / "scratch", tmp_path / "home"
    scratch.mkdir()
    home.mkdir()
    small_stack.reset_sims()
    kind = agent.removesuffix("-node20")
    set_replica_faults(small_stack, {"script": _script(agent),
                                     "script_text_when": COMPACTION[kind] or None})
    since = len(access_lines(small_stack))
    prompt = "Print many words, again and again."
    if kind == "claude":
        exe = agents.claude if agent == "claude" else agents.claude_node20
        run = run_claude(exe, small_stack, scratch, home, prompt=prompt,
                         max_turns=2 * GROWTH_TURNS)
    elif kind == "codex":
        run = run_codex(agents.codex, small_stack, scratch, home, prompt=prompt)
    else:
        run = run_opencode(agents.opencode, small_stack, scratch, home, prompt=prompt)
    lines = access_lines(small_stack, since)
    refusals = [e for e in lines if e["status"] != "200"]
    compacted = _compaction_seen(small_stack, COMPACTION[kind])
    said = " ".join(run.errors) + run.result
    stopped = run.rc != 0 and any(w in said.lower() for w in ("context", "too long"))
    outcome = "compacted" if compacted else "stopped" if stopped else "neither"
    if os.environ.get("SPEEDGATE_AGENT_FIGURES"):
        print(f"\nFIGURES overflow {agent}: requests={len(lines)} refusals={len(refusals)} "
              f"wall_s={run.wall_s:.2f} rc={run.rc} outcome={outcome} said={said[:160]!r}")
    assert run.rc != 124, f"{agent} did not end: {len(lines)} requests"
    assert {e["outcome"] for e in refusals} <= {"context_length_exceeded"}, refusals
    assert 1 <= len(refusals) <= GROWTH_TURNS, refusals  # it went past the limit; no loop
    assert len(lines) <= 3 * GROWTH_TURNS, len(lines)
    assert compacted or stopped, (run.rc, said[-1000:])


DEMO_32K = 32768  # below OpenCode's first prompt + the 32,000 output tokens it always asks
TURNS_32K = 12  # 4,000 words a turn: the conversation passes 32,768 within the run


@pytest.fixture(scope="module")
def stack_32k(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The demo with replicas of ``DEMO_32K`` tokens, one per tier."""
    yield from _small_demo(tmp_path_factory, DEMO_32K)


def test_opencode_on_a_32k_demo_is_served_with_its_cap_lowered(
    agents: Agents, stack_32k: Stack, tmp_path: Path,
) -> None:
    """OpenCode asks ``max_tokens`` 32,000 on every request and answers a refusal of that cap
    only by compacting, so refusing it loops (compact, refused, compact...). The gateway sends
    such a request without its cap instead (``x-speedgate-output-cap: lowered``): its turns are
    served, its conversation grows past the limit, the prompt-too-long refusal makes it
    compact, and the run ends (compacted, or its answer) with bounded requests and refusals."""
    scratch, home = tmp_path / "scratch", tmp_path / "home"
    scratch.mkdir()
    home.mkdir()
    stack_32k.reset_sims()
    tool, arg = SHELL["opencode"]
    script = [{"tool": tool, "arguments": {arg: WORDS, "description": "Print words"}}] * TURNS_32K
    set_replica_faults(stack_32k, {"script": [*script, {"text": "Done printing."}],
                                   "script_text_when": COMPACTION["opencode"]})
    since = len(access_lines(stack_32k))
    run = run_opencode(agents.opencode, stack_32k, scratch, home,
                       prompt="Print many words, again and again.")
    lines = access_lines(stack_32k, since)
    refusals = [e for e in lines if e["status"] != "200"]
    lowered = [e for e in lines if str(e.get("output_cap") or "").startswith("lowered")]
    compacted = _compaction_seen(stack_32k, COMPACTION["opencode"])
    if os.environ.get("SPEEDGATE_AGENT_FIGURES"):
        print(f"\nFIGURES overflow opencode-32k: requests={len(lines)} refusals={len(refusals)}"
              f" lowered={len(lowered)} wall_s={run.wall_s:.2f} rc={run.rc} "
              f"compacted={compacted} result={run.result[:80]!r} errors={run.errors}")
    assert run.rc != 124, f"opencode did not end: {len(lines)} requests"
    assert lowered, "no request was sent with its output cap lowered"
    assert {e["outcome"] for e in refusals} <= {"context_length_exceeded"}, refusals
    assert len(refusals) <= TURNS_32K and len(lines) <= 3 * TURNS_32K, (len(refusals), len(lines))
    assert compacted or run.result, (run.rc, run.errors, run.stderr[-1000:])
