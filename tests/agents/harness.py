"""Running Claude Code, Codex and OpenCode non-interactively against a gateway over simulated
replicas, each configured by the very file ``docs/agents/`` gives users (only the base URL
``http://127.0.0.1:8080`` replaced by the stack's, and the model where a test asks for the fast
alias), so the documented settings are the tested ones.

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
import signal
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
HELLO_TEXT = "hello.py prints hi."
HELLO_TASK = "create hello.py printing hi and run it"
#: the files users copy (docs/agents/), and the base URL they are written for
DOCS_AGENTS = Path(__file__).resolve().parents[2] / "docs" / "agents"
DOCS_BASE_URL = "http://127.0.0.1:8080"
#: test hygiene, not configuration: no telemetry, error reports or update checks
CLAUDE_QUIET = {"DISABLE_TELEMETRY": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1"}
OPENCODE_QUIET = {"OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1",
                  "OPENCODE_DISABLE_LSP_DOWNLOAD": "1", "OPENCODE_DISABLE_SHARE": "1",
                  "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1"}


def docs_file(name: str, base_url: str) -> str:
    """The text of ``docs/agents/<name>`` with its base URL replaced by ``base_url``."""
    text = (DOCS_AGENTS / name).read_text()
    assert DOCS_BASE_URL in text, f"docs/agents/{name} no longer names {DOCS_BASE_URL}"
    return text.replace(DOCS_BASE_URL, base_url)


def docs_env(name: str, base_url: str) -> dict[str, str]:
    """The ``KEY=VALUE`` lines of an env file of ``docs/agents/`` (comments and blank lines
    skipped), its base URL replaced by ``base_url``."""
    env = {}
    for line in docs_file(name, base_url).splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip()
    return env
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


def _file_task(scratch: Path, write: str, shell: str, read: str, path_field: str
               ) -> list[dict[str, Any]]:
    """The four-turn task (write hello.txt, count its bytes into count.txt, read it back,
    answer) in an agent's own tool names and file-path field."""
    return [
        {"text": "Writing the file.", "tool": write,
         "arguments": {path_field: str(scratch / "hello.txt"), "content": "hello agent\n"}},
        {"tool": shell, "arguments": {"command": "wc -c < hello.txt > count.txt",
                                      "description": "Count the bytes"}},
        {"tool": read, "arguments": {path_field: str(scratch / "count.txt")}},
        {"text": FINAL_TEXT},
    ]


def claude_script(scratch: Path) -> list[dict[str, Any]]:
    """Claude Code's tools: ``Write`` (file_path, content), ``Bash`` (command), ``Read``."""
    return _file_task(scratch, "Write", "Bash", "Read", "file_path")


def codex_script() -> list[dict[str, Any]]:
    """Codex's tool: ``exec_command`` (cmd) for each step."""
    return [
        {"text": "Writing the file.", "tool": "exec_command",
         "arguments": {"cmd": "printf 'hello agent\\n' > hello.txt"}},
        {"tool": "exec_command", "arguments": {"cmd": "wc -c < hello.txt > count.txt"}},
        {"tool": "exec_command", "arguments": {"cmd": "cat count.txt"}},
        {"text": FINAL_TEXT},
    ]


def hello_script(agent: str, scratch: Path) -> list[dict[str, Any]]:
    """The model's side of "create hello.py printing hi and run it" in ``agent``'s own
    tools: write ``hello.py`` (``print("hi")``), run ``python3 hello.py``, answer
    :data:`HELLO_TEXT`. Claude Code: ``Write`` (file_path, content) and ``Bash``; Codex:
    ``exec_command`` (cmd) twice; OpenCode: ``write`` (filePath, content) and ``bash``."""
    code = 'print("hi")\n'
    if agent.startswith("claude"):
        calls = [{"tool": "Write", "arguments": {"file_path": str(scratch / "hello.py"),
                                                 "content": code}},
                 {"tool": "Bash", "arguments": {"command": "python3 hello.py",
                                                "description": "Run hello.py"}}]
    elif agent == "codex":
        calls = [{"tool": "exec_command",
                  "arguments": {"cmd": "printf 'print(\"hi\")\\n' > hello.py"}},
                 {"tool": "exec_command", "arguments": {"cmd": "python3 hello.py"}}]
    else:
        calls = [{"tool": "write", "arguments": {"filePath": str(scratch / "hello.py"),
                                                 "content": code}},
                 {"tool": "bash", "arguments": {"command": "python3 hello.py",
                                                "description": "Run hello.py"}}]
    return [{"text": "Writing hello.py.", **calls[0]}, calls[1], {"text": HELLO_TEXT}]


def opencode_script(scratch: Path) -> list[dict[str, Any]]:
    """The four-turn task in OpenCode's tools: ``write`` (filePath, content), ``bash``
    (command), ``read`` (filePath)."""
    return _file_task(scratch, "write", "bash", "read", "filePath")


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


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout_s: float = RUN_TIMEOUT_S,
         ) -> tuple[subprocess.CompletedProcess, float]:
    """Run an agent (its own process group) to its end or ``timeout_s``; past that the group
    is killed and the result's return code is 124 (as ``timeout``'s), output so far kept."""
    base = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", "NO_PROXY": "127.0.0.1,localhost"}
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env={**base, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        rc = 124
    return subprocess.CompletedProcess(cmd, rc, out, err), time.monotonic() - t0


def run_claude(claude: Path, stack: Stack, scratch: Path, home: Path, model: str | None = None,
               prompt: str = "Write hello.txt, count its bytes into count.txt, read it back.",
               max_turns: int | None = 10, allowed_tools: str | None = "Write,Bash,Read",
               ) -> AgentRun:
    """``claude -p`` on ``prompt``, configured by ``docs/agents/claude-code.env`` (``model``,
    when given, replaces its models), with permission for ``allowed_tools`` (a
    non-interactive run cannot ask; every other tool stays offered; None: Claude Code's own
    defaults) and at most ``max_turns`` turns (None: no ``--max-turns``)."""
    env = {"HOME": str(home), **docs_env("claude-code.env", stack.base_url), **CLAUDE_QUIET}
    if model is not None:
        env |= {k: model for k in ("ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL",
                                    "ANTHROPIC_SMALL_FAST_MODEL")}
    cmd = [str(claude), "-p", prompt, "--output-format", "json"]
    if allowed_tools is not None:
        cmd += ["--allowedTools", allowed_tools]
    if max_turns is not None:
        cmd += ["--max-turns", str(max_turns)]
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


def run_codex(codex: Path, stack: Stack, scratch: Path, home: Path, model: str | None = None,
              prompt: str = "Write hello.txt, count its bytes into count.txt, read it back.",
              ) -> AgentRun:
    """``codex exec`` on ``prompt``, its ``config.toml`` ``docs/agents/codex-config.toml``
    (``model``, when given, replaces its model) with update checks and analytics off."""
    codex_home = home / "codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    config = docs_file("codex-config.toml", stack.base_url)
    if model is not None:
        config = re.sub(r'(?m)^model = ".*"$', f'model = "{model}"', config)
    (codex_home / "config.toml").write_text(  # top-level keys first, a table last
        f"check_for_update_on_startup = false\n{config}\n[analytics]\nenabled = false\n")
    env = {"HOME": str(home), "CODEX_HOME": str(codex_home), "SPEEDGATE_API_KEY": "sk-test"}
    cmd = [str(codex), "exec", "--skip-git-repo-check", "--json",
           "--dangerously-bypass-approvals-and-sandbox", prompt]
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


def run_opencode(opencode: Path, stack: Stack, scratch: Path, home: Path,
                 model: str | None = None, prompt: str = HELLO_TASK) -> AgentRun:
    """``opencode run --format json --auto`` on ``prompt`` (``--auto``: its permissions
    granted, as a non-interactive run needs), configured by ``docs/agents/opencode.json`` as
    the user's global config (``$XDG_CONFIG_HOME/opencode/opencode.json``; ``model``, when
    given, replaces its model), every XDG folder in the temp home. ``turns``: its tool calls;
    ``result``: its last text; ``errors``: its ``error`` events' messages."""
    config = docs_file("opencode.json", stack.base_url)
    if model is not None:
        config = config.replace('"model": "speedgate/mymodel-fast"',
                                f'"model": "speedgate/{model}"')
    xdg = {f"XDG_{k}_HOME": str(home / k.lower()) for k in ("CONFIG", "DATA", "CACHE", "STATE")}
    (home / "config" / "opencode").mkdir(parents=True, exist_ok=True)
    (home / "config" / "opencode" / "opencode.json").write_text(config)
    env = {"HOME": str(home), **xdg, **OPENCODE_QUIET, "SPEEDGATE_API_KEY": "sk-test"}
    cmd = [str(opencode), "run", "--format", "json", "--auto", prompt]
    done, wall = _run(cmd, scratch, env)
    run = AgentRun(done.returncode, done.stdout, done.stderr, wall)
    for line in done.stdout.splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        part = ev.get("part") or {}
        run.session_id = run.session_id or ev.get("sessionID")
        if ev.get("type") == "text" and not part.get("synthetic"):
            run.result = part.get("text") or ""
        elif ev.get("type") == "tool_use":
            run.turns += 1
        elif ev.get("type") == "step_finish":
            t = part.get("tokens") or {}
            run.prompt_tokens += (t.get("input") or 0) + ((t.get("cache") or {}).get("read")
                                                           or 0)
            run.output_tokens += t.get("output") or 0
        elif ev.get("type") == "error":
            err = ev.get("error") or {}
            run.errors.append(f"{err.get('name')}: {(err.get('data') or {}).get('message')}")
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
