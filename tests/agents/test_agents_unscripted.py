"""Each agent, unscripted, against ``speedgate demo`` on its own defaults (only its simulated
time sped up): "create hello.py printing hi and run it" with the agent's default tools and no
simulator script, as a newcomer first tries it. The simulated model answers on its own
(``engines.sim.agent``): the run ends by itself, in a few requests, with exit status 0; no
subagent is spawned (Claude Code offers its ``Agent`` tool first, OpenCode ``task``, Codex
``multi_agent_v1``) and nothing loops.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.agents.demo_stack import DemoStack
from tests.agents.harness import (
    HELLO_TASK,
    access_lines,
    run_claude,
    run_codex,
    run_opencode,
    set_replica_faults,
)
from tests.agents.install import Agents

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
#: requests of one run at most: the first turn (a read-only tool), the turn after its result
#: (text), and each agent's side requests (titles, a quota probe); a subagent or a loop passes it
MAX_REQUESTS = 8
#: the run's wall time at most, generous for a shared 2-core machine (they take 1-8 s)
MAX_WALL_S = 90.0
#: a tool's result reached the model: Messages, Responses and chat completions forms
RESULT_MARKS = ('"tool_result"', '"function_call_output"', '"role": "tool"')


@pytest.mark.parametrize("agent", ["claude", "claude-node20", "codex", "opencode"])
def test_unscripted_hello_ends_by_itself(agent: str, agents: Agents, stack: DemoStack,
                                         tmp_path: Path) -> None:
    """The unscripted run exits 0 within ``MAX_WALL_S`` after at most ``MAX_REQUESTS``
    requests, every one answered 200, and its tool call's result went back to the model."""
    scratch, home = tmp_path / "scratch", tmp_path / "home"
    scratch.mkdir()
    home.mkdir()
    stack.reset_sims()
    set_replica_faults(stack, {})
    since = len(access_lines(stack))
    if agent.startswith("claude"):
        exe = agents.claude if agent == "claude" else agents.claude_node20
        run = run_claude(exe, stack, scratch, home, prompt=HELLO_TASK, max_turns=None,
                         allowed_tools=None)
    elif agent == "codex":
        run = run_codex(agents.codex, stack, scratch, home, prompt=HELLO_TASK)
    else:
        run = run_opencode(agents.opencode, stack, scratch, home, prompt=HELLO_TASK)
    lines = access_lines(stack, since)
    if os.environ.get("SPEEDGATE_AGENT_FIGURES"):
        print(f"\nFIGURES unscripted {agent}: requests={len(lines)} wall_s={run.wall_s:.2f} "
              f"rc={run.rc} errors={run.errors[:2]!r}")
    assert run.rc == 0, (run.rc, len(lines), run.errors, run.stderr[-1000:])
    assert run.wall_s < MAX_WALL_S, run.wall_s
    assert 2 <= len(lines) <= MAX_REQUESTS, [(e["path"], e["status"]) for e in lines]
    assert {e["status"] for e in lines} == {"200"}, lines
    bodies = [json.dumps(r.get("body"), indent=None, separators=(", ", ": "))
              for r in stack.sim_requests()]
    assert any(m in b for b in bodies for m in RESULT_MARKS), "no tool result reached a replica"
