"""Claude Code (``claude -p``, Messages API; @latest and the version npm picks on node 20),
Codex (``codex exec``, Responses API) and OpenCode (``opencode run``, chat completions) run
scripted tasks with their real tools through ``speedgate demo`` on its own defaults (only its
simulated time sped up), each configured by its file in ``docs/agents/``: "create hello.py
printing hi and run it", a several-turn task (its effect on disk, affinity, the fast tier
asked by the model alias, usage totals equal to the sum of the turns, the agent's own id as
the session key), and a replica killed while a turn is in flight (the turn still
completes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.agents.harness import (
    FINAL_TEXT,
    HELLO_TASK,
    HELLO_TEXT,
    AgentRun,
    KillMidTurn,
    access_lines,
    added_latency_s,
    claude_script,
    codex_script,
    docs_file,
    hello_script,
    opencode_script,
    run_claude,
    run_codex,
    run_opencode,
    set_replica_faults,
)
from tests.agents.install import Agents
from tests.e2e.stack import MODEL, Stack

# the first run may install the pinned agents from npm (under a minute; .ci/run does it first)
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
TURNS = 4  # requests of the scripted task: write, run, read, answer


AGENTS = ("claude", "claude-node20", "codex", "opencode")


def runner(agent: str, agents: Agents) -> tuple[Any, Path]:
    """The harness's run function of ``agent`` and its executable."""
    return {"claude": (run_claude, agents.claude),
            "claude-node20": (run_claude, agents.claude_node20),
            "codex": (run_codex, agents.codex),
            "opencode": (run_opencode, agents.opencode)}[agent]


def _run(agent: str, agents: Agents, stack: Stack, tmp: Path, model: str | None,
         faults: dict[str, Any] | None = None, kill_turn: int | None = None,
         script_task: bool = True, script: list[dict[str, Any]] | None = None,
         **kw: Any) -> tuple[AgentRun, list[dict[str, Any]], Path, str | None]:
    scratch, home = tmp / "scratch", tmp / "home"
    scratch.mkdir()
    home.mkdir()
    stack.reset_sims()
    if script is None:
        script = {"codex": codex_script, "opencode": lambda: opencode_script(scratch)}.get(
            agent, lambda: claude_script(scratch))()
    set_replica_faults(stack, {"script": script, **(faults or {})} if script_task else {})
    since = len(access_lines(stack))
    fn, exe = runner(agent, agents)
    killed = None
    if kill_turn is None:
        run = fn(exe, stack, scratch, home, model, **kw)
    else:
        with KillMidTurn(stack, "standard", kill_turn) as k:
            run = fn(exe, stack, scratch, home, model, **kw)
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
    assert not run.errors and run.result.strip() == FINAL_TEXT, (run.errors, run.result)
    assert (scratch / "hello.txt").read_text() == "hello agent\n"
    assert (scratch / "count.txt").read_text().strip() == "12"


def _tool_outputs(body: dict[str, Any]) -> list[str]:
    """The tool results' text in a request body the replica received (any API's shape)."""
    out = []
    for m in body.get("messages") or body.get("input") or ():
        if not isinstance(m, dict):
            continue
        if m.get("role") == "tool" or m.get("type") == "function_call_output":
            c = m.get("content") if m.get("role") == "tool" else m.get("output")
            out.append(json.dumps(c) if not isinstance(c, str) else c)
        elif isinstance(m.get("content"), list):
            out += [json.dumps(b.get("content")) for b in m["content"]
                    if isinstance(b, dict) and b.get("type") == "tool_result"]
    return out


@pytest.mark.parametrize("agent", AGENTS)
def test_hello_task_on_the_demos_defaults(agent: str, agents: Agents, stack: Stack,
                                          tmp_path: Path) -> None:
    """Each agent, configured exactly as its ``docs/agents/`` file says (the demo's model,
    ``mymodel``) and with its default tools, does "create hello.py printing hi and run it"
    through the demo on its own defaults (no context or KV override): the model's side
    (scripted) writes hello.py, runs ``python3 hello.py``, answers. The file is on disk, the
    last turn received the command's output ``hi``, every request got 200."""
    scratch = tmp_path / "scratch"
    run, lines, scratch, _ = _run(agent, agents, stack, tmp_path, None,
                                  script=hello_script(agent, scratch), prompt=HELLO_TASK)
    if os.environ.get("SPEEDGATE_AGENT_FIGURES"):
        print(f"\nFIGURES hello {agent}: requests={len(lines)} refusals="
              f"{sum(e['status'] != '200' for e in lines)} wall_s={run.wall_s:.2f} "
              f"rc={run.rc}")
    assert run.rc == 0, run.stderr[-2000:] + run.stdout[-2000:]
    assert not run.errors and run.result.strip() == HELLO_TEXT, (run.errors, run.result)
    assert (scratch / "hello.py").read_text() == 'print("hi")\n'
    assert all(e["status"] == "200" for e in lines), lines
    with_tools = [e["body"] for e in stack.sim_requests() if (e.get("body") or {}).get("tools")]
    assert len(with_tools) == 3  # write, run, answer
    last = max(with_tools, key=lambda b: len(json.dumps(b)))
    assert any(o.strip().endswith("hi") or '"hi' in o for o in _tool_outputs(last)), last


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


@pytest.mark.parametrize("agent", ["claude", "codex", "opencode"])
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
        # OpenCode also asks for its session's title (no tools, beside the first turn)
        assert len(lines) == TURNS + (agent == "opencode")
        assert [int(e["attempts"]) >= 2 for e in lines].count(True) == 1, lines
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


def test_agents_sdk_snippet_runs(stack: Stack, tmp_path: Path) -> None:
    """``docs/agents/agents_sdk.py``, its base URL the demo's, runs to its end: an answer
    printed, its one request through the gateway with the snippet's ``x-session-id``."""
    snippet = tmp_path / "agents_sdk.py"
    snippet.write_text(docs_file("agents_sdk.py", stack.base_url))
    since = len(access_lines(stack))
    done = subprocess.run([sys.executable, str(snippet)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env={**os.environ, "OPENAI_API_KEY": ""})
    assert done.returncode == 0 and done.stdout.strip(), done.stderr[-2000:]
    lines = access_lines(stack, since)
    assert lines and all(e["status"] == "200" for e in lines), lines
    assert {(e["session_id"], e["session_src"]) for e in lines} == {("my-task-1", "header")}
