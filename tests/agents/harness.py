"""Running Claude Code and Codex non-interactively against a gateway over simulated replicas.

Each agent gets a temp home (no user config, no login), telemetry and update checks off, and
only the gateway as its endpoint. The simulators play a scripted task (``engines.sim.agent``:
the fault field ``script``), so the agent writes a file, runs a command and reads the result
back with its real tools in a scratch folder, then answers text. What the gateway saw is read
from its access log (one ``speedgate.access`` line per request).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.e2e.stack import Stack

RUN_TIMEOUT_S = 120
FINAL_TEXT = "The count is in count.txt."
_PAIR = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')


def access_lines(stack: Stack, since: int = 0) -> list[dict[str, Any]]:
    """The gateway's access-log entries (after the first ``since``), as dicts of the
    ``key=value`` pairs (quoted values decoded; ``None`` as None)."""
    out = []
    for line in stack.log().splitlines():
        if " speedgate.access " not in line:
            continue
        entry: dict[str, Any] = {}
        for key, raw in _PAIR.findall(line.split(" speedgate.access ", 1)[1]):
            value = json.loads(raw) if raw.startswith('"') else raw
            entry[key] = None if value == "None" else value
        out.append(entry)
    return out[since:]


def claude_script(scratch: Path) -> list[dict[str, Any]]:
    """Claude Code's tools: ``Write`` (file_path, content), ``Bash`` (command), ``Read``."""
    return [
        {"text": "Writing the file.", "tool": "Write",
         "arguments": {"file_path": str(scratch / "hello.txt"), "content": "hello agent\n"}},
        {"tool": "Bash", "arguments": {"command": "wc -c < hello.txt > count.txt",
                                       "description": "Count the bytes"}},
        {"tool": "Read", "arguments": {"file_path": str(scratch / "count.txt")}},
        {"text": FINAL_TEXT},
    ]


def codex_script() -> list[dict[str, Any]]:
    """Codex's tool: ``exec_command`` (cmd) for each step."""
    return [
        {"text": "Writing the file.", "tool": "exec_command",
         "arguments": {"cmd": "printf 'hello agent\\n' > hello.txt"}},
        {"tool": "exec_command", "arguments": {"cmd": "wc -c < hello.txt > count.txt"}},
        {"tool": "exec_command", "arguments": {"cmd": "cat count.txt"}},
        {"text": FINAL_TEXT},
    ]


def set_replica_faults(stack: Stack, faults: dict[str, Any]) -> None:
    """Replace every simulator's fault script (the scripted turns included)."""
    with httpx.Client(timeout=5) as c:
        for url in stack.all_sims():
            c.post(url + "/sim/faults", json=faults).raise_for_status()


@dataclass
class AgentRun:
    """One finished agent run: exit code, output, wall time (s), the agent's own session id
    and token usage (prompt tokens all included, output tokens), its turns."""

    rc: int
    stdout: str
    stderr: str
    wall_s: float
    session_id: str | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    turns: int = 0
    result: str = ""
    errors: list[str] = field(default_factory=list)


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess,
                                                                   float]:
    base = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", "NO_PROXY": "127.0.0.1,localhost"}
    t0 = time.monotonic()
    done = subprocess.run(cmd, cwd=cwd, env={**base, **env}, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, stdin=subprocess.DEVNULL)
    return done, time.monotonic() - t0


def run_claude(claude: Path, stack: Stack, scratch: Path, home: Path, model: str) -> AgentRun:
    """``claude -p`` on the scripted task with the Write, Bash and Read tools allowed."""
    env = {"HOME": str(home), "ANTHROPIC_BASE_URL": stack.base_url,
           "ANTHROPIC_API_KEY": "sk-test", "ANTHROPIC_MODEL": model,
           "ANTHROPIC_SMALL_FAST_MODEL": model, "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
           "DISABLE_TELEMETRY": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
           "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1"}
    cmd = [str(claude), "-p", "Write hello.txt, count its bytes into count.txt, read it back.",
           "--allowedTools", "Write,Bash,Read", "--output-format", "json", "--max-turns", "10"]
    done, wall = _run(cmd, scratch, env)
    run = AgentRun(done.returncode, done.stdout, done.stderr, wall)
    try:
        doc = json.loads(done.stdout)
    except ValueError:
        run.errors.append(f"no JSON result: {done.stdout[-500:]!r}")
        return run
    u = doc.get("usage") or {}
    run.session_id = doc.get("session_id")
    run.prompt_tokens = sum(u.get(k) or 0 for k in (
        "input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"))
    run.output_tokens = u.get("output_tokens") or 0
    run.turns = doc.get("num_turns") or 0
    run.result = doc.get("result") or ""
    if doc.get("is_error") or doc.get("api_error_status"):
        run.errors.append(f"{doc.get('api_error_status')}: {run.result}")
    return run


def run_codex(codex: Path, stack: Stack, scratch: Path, home: Path, model: str) -> AgentRun:
    """``codex exec`` on the scripted task, its provider the gateway (Responses API)."""
    codex_home = home / "codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(
        f'model = "{model}"\nmodel_provider = "speedgate"\n'
        "check_for_update_on_startup = false\n"
        "[model_providers.speedgate]\nname = \"speedgate\"\n"
        f'base_url = "{stack.base_url}/v1"\nwire_api = "responses"\n'
        'env_key = "SPEEDGATE_API_KEY"\n[analytics]\nenabled = false\n')
    env = {"HOME": str(home), "CODEX_HOME": str(codex_home), "SPEEDGATE_API_KEY": "sk-test"}
    cmd = [str(codex), "exec", "--skip-git-repo-check", "--json",
           "--dangerously-bypass-approvals-and-sandbox",
           "Write hello.txt, count its bytes into count.txt, read it back."]
    done, wall = _run(cmd, scratch, env)
    run = AgentRun(done.returncode, done.stdout, done.stderr, wall)
    for line in done.stdout.splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        kind = ev.get("type")
        item = ev.get("item") or {}
        if kind == "thread.started":
            run.session_id = ev.get("thread_id")
        elif kind == "turn.completed":
            u = ev.get("usage") or {}
            run.prompt_tokens += u.get("input_tokens") or 0
            run.output_tokens += u.get("output_tokens") or 0
        elif kind == "item.completed" and item.get("type") == "agent_message":
            run.result = item.get("text") or ""
        elif kind == "item.completed" and item.get("type") == "command_execution":
            run.turns += 1
        elif kind in ("error", "turn.failed"):
            run.errors.append(line)
        elif kind == "item.completed" and item.get("type") == "error" and (
                "metadata" not in (item.get("message") or "")):  # an unknown model's notice
            run.errors.append(line)
    return run


class KillMidTurn:
    """Kills (SIGKILL) the simulator serving turn ``turn`` of the run while that turn's
    request is in flight (received, not answered: the replicas hold each answer back by
    their ``ttft_delay_s``), from a polling thread; ``killed`` is its URL once done."""

    def __init__(self, stack: Stack, tier: str, turn: int) -> None:
        self.stack, self.tier, self.turn = stack, tier, turn
        self.killed: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> KillMidTurn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _watch(self) -> None:
        with httpx.Client(timeout=2) as c:
            while not self._stop.is_set() and self.killed is None:
                for url in self.stack.sims[self.tier]:
                    try:
                        log = c.get(url + "/sim/requests").json()
                    except httpx.HTTPError:
                        continue
                    with_tools = [e for e in log if (e.get("body") or {}).get("tools")]
                    if len(with_tools) > self.turn and not with_tools[self.turn]["completed"]:
                        self.stack.kill_sim(url, crash=True)
                        self.killed = url
                        return
                time.sleep(0.05)


def added_latency_s(stack: Stack, tier: str, alias: str, rounds: int = 3) -> float:
    """The gateway's added latency per turn (seconds): every request the ``tier``'s replicas
    received in the run (as the gateway forwarded them) is replayed ``rounds`` times, each
    time directly to its replica and through the gateway (model ``alias``, the same replica
    by affinity, its prefix cached by then; a session of its own, so the run's totals stay
    the run's); the median of (gateway − direct) wall times."""
    turns = []
    with httpx.Client(timeout=30) as c:
        for url in stack.sims[tier]:
            for entry in c.get(url + "/sim/requests").json():
                if isinstance(entry.get("body"), dict) and entry["path"].startswith("/v1/"):
                    turns.append((url, entry["path"], entry["body"]))
        gaps = []
        for url, path, body in turns:
            for _ in range(rounds):
                t0 = time.perf_counter()
                c.post(url + path, json=body).read()
                t1 = time.perf_counter()
                c.post(stack.base_url + path, json={**body, "model": alias},
                       headers={"x-session-id": "figures-replay"}).read()  # not the run's
                gaps.append((time.perf_counter() - t1) - (t1 - t0))
    gaps.sort()
    return gaps[len(gaps) // 2] if gaps else 0.0
