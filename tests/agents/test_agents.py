"""Claude Code (``claude -p``, Messages API) and Codex (``codex exec``, Responses API) run a
scripted several-turn task with their real tools through the gateway over simulated replicas:
the task's effect on disk, affinity (every turn on one replica), the fast tier asked by the
model alias, usage totals equal to the sum of the turns, the agent's own id as the session
key, and a replica killed while a turn is in flight (the turn still completes)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.agents.harness import (
    FINAL_TEXT,
    AgentRun,
    KillMidTurn,
    access_lines,
    added_latency_s,
    claude_script,
    codex_script,
    run_claude,
    run_codex,
    set_replica_faults,
)
from tests.agents.install import Agents
from tests.e2e.stack import MODEL, Stack

# the first run may install the pinned agents from npm (under a minute; .ci/run does it first)
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
TURNS = 4  # requests of the scripted task: write, run, read, answer


def _run(agent: str, agents: Agents, stack: Stack, tmp: Path, model: str,
         faults: dict[str, Any] | None = None, kill_turn: int | None = None,
         script_task: bool = True, script: list[dict[str, Any]] | None = None,
         ) -> tuple[AgentRun, list[dict[str, Any]], Path, str | None]:
    scratch, home = tmp / "scratch", tmp / "home"
    scratch.mkdir()
    home.mkdir()
    stack.reset_sims()
    if script is None:
        script = claude_script(scratch) if agent == "claude" else codex_script()
    set_replica_faults(stack, {"script": script, **(faults or {})} if script_task else {})
    since = len(access_lines(stack))
    runner = run_claude if agent == "claude" else run_codex
    killed = None
    if kill_turn is None:
        run = runner(getattr(agents, agent), stack, scratch, home, model)
    else:
        with KillMidTurn(stack, "standard", kill_turn) as k:
            run = runner(getattr(agents, agent), stack, scratch, home, model)
        killed = k.killed
    return run, access_lines(stack, since), scratch, killed


@pytest.fixture(scope="module", params=["claude", "codex"])
def fast_run(request: pytest.FixtureRequest, agents: Agents, stack: Stack,
             tmp_path_factory: pytest.TempPathFactory
             ) -> tuple[str, AgentRun, list[dict[str, Any]], Path]:
    """The scripted task with the fast alias (``mymodel-fast``)."""
    agent = request.param
    run, lines, scratch, _ = _run(agent, agents, stack, tmp_path_factory.mktemp(agent),
                                  f"{MODEL}-fast")
    if run.rc == 0 and os.environ.get("SPEEDGATE_AGENT_FIGURES"):  # the docs' figures (-s)
        added = added_latency_s(stack, "fast", f"{MODEL}-fast")
        print(f"\nFIGURES {agent}: turns={run.turns} requests={len(lines)} "
              f"wall_s={run.wall_s:.2f} gateway_added_ms_per_turn={added * 1000:.1f}")
    return agent, run, lines, scratch


def check_task(run: AgentRun, scratch: Path) -> None:
    """Exit 0, no error seen, the final text, and the files the tools wrote."""
    assert run.rc == 0, run.stderr[-2000:] + run.stdout[-2000:]
    assert not run.errors and run.result.strip() == FINAL_TEXT
    assert (scratch / "hello.txt").read_text() == "hello agent\n"
    assert (scratch / "count.txt").read_text().strip() == "12"


def test_scripted_task_completes(fast_run) -> None:
    _, run, _, scratch = fast_run
    check_task(run, scratch)


def test_every_turn_on_one_fast_replica(fast_run) -> None:
    lines = fast_run[2]
    assert len(lines) == TURNS and all(e["status"] == "200" for e in lines), lines
    assert {e["tier"] for e in lines} == {"fast"}
    assert len({e["replica"] for e in lines}) == 1  # affinity across the turns


def test_usage_is_the_sum_of_the_turns(fast_run) -> None:
    _, run, lines, _ = fast_run
    assert run.prompt_tokens == sum(int(e["prompt_tokens"]) for e in lines) > 0
    assert run.output_tokens == sum(int(e["completion_tokens"]) for e in lines) > 0


def test_session_key_is_the_agents_id(fast_run, stack: Stack) -> None:
    _, run, lines, _ = fast_run
    assert run.session_id and {e["session_id"] for e in lines} == {run.session_id}
    totals = httpx.get(stack.base_url + "/v1/usage", params={"session_id": run.session_id}
                       ).json()
    assert totals["requests"] == TURNS
    assert totals["input_tokens"] == sum(int(e["prompt_tokens"]) for e in lines)
    assert totals["output_tokens"] == sum(int(e["completion_tokens"]) for e in lines)


@pytest.mark.parametrize("agent", ["claude", "codex"])
def test_replica_killed_mid_turn(agent: str, agents: Agents, stack: Stack,
                                 tmp_path: Path) -> None:
    """Every replica holds each answer back 1 s (``ttft_delay_s``); the one serving the third
    turn is killed while that request is in flight. The gateway asks another replica, the
    agent sees no error and finishes the task."""
    run, lines, scratch, killed = _run(agent, agents, stack, tmp_path, MODEL,
                                       faults={"ttft_delay_s": 1.0}, kill_turn=2)
    try:
        assert killed is not None
        check_task(run, scratch)
        assert all(e["status"] == "200" for e in lines), lines
        assert len(lines) == TURNS and int(lines[2]["attempts"]) >= 2
        assert lines[2]["replica"] != lines[1]["replica"]
    finally:
        if killed is not None:
            stack.restart_sim(killed)


def test_replica_reset_mid_answer_resumes_claude(agents: Agents, stack: Stack,
                                                tmp_path: Path) -> None:
    """The replica serving Claude Code's final turn aborts its connection after the answer's
    first 3 text deltas reached the agent (the script's ``reset_after_chunks`` on that turn):
    the gateway continues the text on the other replica (mid-stream resume), the agent exits
    0 with the whole answer and never sees an error."""
    scratch = tmp_path / "scratch"
    script = claude_script(scratch)
    script[-1] = {**script[-1], "reset_after_chunks": 3}
    run, lines, scratch, _ = _run("claude", agents, stack, tmp_path, MODEL, script=script)
    check_task(run, scratch)
    assert len(lines) == TURNS and all(e["status"] == "200" for e in lines), lines
    last = lines[-1]
    assert last["resumes"] == "1" and int(last["attempts"]) == 2, last
    assert last["outcome"] == "ok" and last["replica"] != lines[-2]["replica"]


def test_replica_reset_mid_answer_resumes_codex(agents: Agents, stack: Stack,
                                               tmp_path: Path) -> None:
    """The replica serving Codex's final turn (Responses API, ``wire_api = "responses"``)
    aborts its connection after the answer's first 3 text deltas reached the agent: the
    gateway continues the message's text on the other replica (mid-stream resume of a
    Responses stream), Codex exits 0 with the task done and never sees an error."""
    script = codex_script()
    script[-1] = {**script[-1], "reset_after_chunks": 3}
    run, lines, scratch, _ = _run("codex", agents, stack, tmp_path, MODEL, script=script)
    check_task(run, scratch)
    assert len(lines) == TURNS and all(e["status"] == "200" for e in lines), lines
    last = lines[-1]
    assert last["resumes"] == "1" and int(last["attempts"]) == 2, last
    assert last["outcome"] == "ok" and last["replica"] != lines[-2]["replica"]


def test_unscripted_codex_run_ends(agents: Agents, stack: Stack, tmp_path: Path) -> None:
    """Without a script Codex's loop ends too: the first answer calls its first tool with
    schema-valid arguments (``cmd`` a word: a command that fails), the answer after that tool
    result is text."""
    run, lines, _, _ = _run("codex", agents, stack, tmp_path, MODEL, script_task=False)
    assert run.rc == 0 and not run.errors, run.stdout[-2000:]
    assert len(lines) == 2 and all(e["status"] == "200" for e in lines)
    assert run.turns == 1 and run.result
