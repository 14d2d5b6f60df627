"""``speedgate demo`` serves real requests and leaves no engine process behind."""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from engines.procs import die_with_parent, wait_port_file

pytestmark = pytest.mark.e2e


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    return [int(x) for x in out.stdout.split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purpose
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


#: A descriptor limit too low for the default ``server.max_connections`` (10,000 needs 20,256):
#: the demo raises the soft limit to the hard one and sizes its cap to fit, without a warning.
LOW_NOFILE = (1024, 4096)


def _low_fd_limit_child() -> None:
    die_with_parent()
    resource.setrlimit(resource.RLIMIT_NOFILE, LOW_NOFILE)


def _soft_nofile(pid: int) -> int:
    with open(f"/proc/{pid}/limits") as f:
        line = next(ln for ln in f if ln.startswith("Max open files"))
    return int(line.split()[3])


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_demo_serves_and_stops_cleanly(sig: signal.Signals, tmp_path):
    port_file = tmp_path / "port"
    stderr = (tmp_path / "stderr").open("w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "demo", "--port", "0", "--port-file", str(port_file),
         "--replicas", "1", "--time-scale", "0.01"],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        preexec_fn=_low_fd_limit_child,
    )
    try:
        port = wait_port_file(port_file, proc, timeout_s=60)  # the port the demo bound itself
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        else:
            pytest.fail("demo gateway did not come up")
        sims = _children(proc.pid)
        assert len(sims) == 2  # one simulator per tier
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        r = client.chat.completions.with_raw_response.create(
            model="mymodel-fast", messages=[{"role": "user", "content": "hi"}], max_tokens=5
        )
        assert r.headers["x-speedgate-tier"] == "fast"
        assert r.parse().choices[0].message.content
        # a default start is clean: the soft limit raised to the hard one, no WARNING logged
        assert _soft_nofile(proc.pid) == LOW_NOFILE[1]
        stderr.seek(0)
        started = stderr.read()
        assert "WARNING" not in started and "ERROR" not in started, started
        proc.send_signal(sig)
        assert proc.wait(timeout=20) == 0
        out = proc.stdout.read() if proc.stdout else ""
        assert f"http://127.0.0.1:{port}" in out and "curl" in out
        time.sleep(0.2)
        assert [p for p in sims if _alive(p)] == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        stderr.close()


# --- the newcomer's first minutes ---------------------------------------------

REPO = Path(__file__).resolve().parents[2]


def _readme_block(starts: str, ends: str) -> str:
    """The README lines from the one starting with ``starts`` through the next one starting
    with ``ends`` (a shell command as a newcomer would paste it)."""
    lines = (REPO / "README.md").read_text().splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.startswith(starts))
    last = next(i for i in range(first + 1, len(lines)) if lines[i].startswith(ends))
    return "\n".join(lines[first:last + 1]) + "\n"


def _fresh_shell(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``script`` in bash with an empty environment (no venv activated, no PYTHONPATH)."""
    return subprocess.run(["env", "-i", "PATH=/usr/bin:/bin", f"HOME={cwd}", "bash", "-c", script],
                          cwd=cwd, capture_output=True, text=True, timeout=60)


def test_item5_make_demo_readme_snippets_in_a_fresh_shell_and_kill_term_stops_all(tmp_path):
    # the venv `make demo` would have made: its stamp is up to date, its speedgate runs ours
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    script = venv / "bin" / "speedgate"
    script.write_text(f'#!/bin/sh\nexec {sys.executable} -m gateway "$@"\n')
    script.chmod(0o755)
    (venv / ".installed-runtime").touch()
    port_file = tmp_path / "port"
    make = subprocess.Popen(
        ["make", "-s", "-C", str(REPO), "demo", f"VENV={venv}", "PORT=0",
         f"DEMO_ARGS=--port-file {port_file} --replicas 1 --time-scale 0.01"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=die_with_parent,
    )
    tree: list[psutil.Process] = []
    try:
        port = wait_port_file(port_file, make, timeout_s=60)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        else:
            pytest.fail("demo gateway did not come up")
        tree = psutil.Process(make.pid).children(recursive=True)
        assert len(tree) >= 3  # the demo and one simulator per tier
        # the README's snippets, pasted into a fresh shell in a clone whose .venv is this one
        clone = tmp_path / "clone"
        clone.mkdir()
        (clone / ".venv").symlink_to(sys.prefix)
        here = f"127.0.0.1:{port}"
        curl = _readme_block("curl -s http://127.0.0.1:8080", "       \"messages\"")
        r = _fresh_shell(curl.replace("127.0.0.1:8080", here), clone)
        assert r.returncode == 0 and " 200" in r.stdout.splitlines()[0], r.stdout + r.stderr
        assert "x-speedgate-tier: fast" in r.stdout.lower()
        py = _readme_block(".venv/bin/python - <<'EOF'", "EOF")
        r = _fresh_shell(py.replace("127.0.0.1:8080", here), clone)
        assert r.returncode == 0 and r.stdout.strip(), r.stdout + r.stderr
        # SIGTERM to make alone: make forwards it to its child, which is the demo (exec)
        make.send_signal(signal.SIGTERM)
        make.wait(timeout=20)
        _, alive = psutil.wait_procs(tree, timeout=20)
        assert alive == [], [p.cmdline() for p in alive]
    finally:
        for p in [*tree, psutil.Process(make.pid) if make.poll() is None else None]:
            if p is not None and p.is_running():
                p.kill()


def test_demo_on_a_taken_port_says_so_and_stops_its_simulators(tmp_path):
    """The gateway's port already taken (another demo): exit status 1 and one line naming the
    address and how to pick another port, no traceback, and no simulator left running."""
    mark = uuid.uuid4().hex  # inherited by the simulators: finds them even once orphaned
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run(
            [sys.executable, "-m", "gateway", "demo", "--port", str(port), "--replicas", "1",
             "--time-scale", "0.01"],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "SPEEDGATE_TEST_MARK": mark})
    assert r.returncode == 1, r.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in r.stderr and "PORT=" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    left = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("SPEEDGATE_TEST_MARK") == mark:
                left.append(p)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    for p in left:
        p.kill()
    assert left == []


# --- the demo is a million-token model: its defaults hold a coding agent's session ------------

MILLION = 1_048_576
H200_70B_KV_TOKENS = 2_895_696  # `speedgate capacity llama-3-70b --tp 8`: 180,981 blocks x 16


def _start_demo(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, str]:
    """A demo (one replica per tier, no modelled delays) with ``args``; its process and base
    URL once its gateway answers ``/healthz``."""
    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "demo", "--port", "0", "--port-file", str(port_file),
         "--replicas", "1", "--time-scale", "0", *args],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, preexec_fn=die_with_parent)
    port = wait_port_file(port_file, proc, timeout_s=60)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    pytest.fail("demo gateway did not come up")


def _stop_demo(proc: subprocess.Popen) -> str:
    """SIGTERM the demo, wait for it; its stdout (the banner)."""
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.stdout.read() if proc.stdout else ""


def _model_limits(base: str) -> dict[str, int | None]:
    doc = httpx.get(base + "/v1/models", timeout=5).json()
    return {m["id"]: m.get("max_model_len") for m in doc["data"]}


def _kv_tokens(base: str) -> list[int]:
    state = httpx.get(base + "/v1/console/state", timeout=5).json()
    return [r["engine"]["kv_tokens"] for p in state["models"][0]["pools"] for r in p["replicas"]]


def _learned(base: str) -> bool:
    return all(_model_limits(base).values()) and all(_kv_tokens(base))


def _claude_code_like(client: object, prompt_words: int) -> object:
    """A first turn as Claude Code sends it: a long system prompt with tools, ``max_tokens``
    32000, streamed."""
    tools = [{"name": f"Tool{i}", "description": "A tool. " * 50,
              "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}
             for i in range(25)]
    with client.messages.stream(  # type: ignore[attr-defined]
        model="mymodel-fast", max_tokens=32_000, system="You are a coding agent. " * 10,
        tools=tools, messages=[{"role": "user", "content": "word " * prompt_words}],
    ) as stream:
        return stream.get_final_message()


def _banner_block(out: str, after: str) -> str:
    """The indented lines under the banner line containing ``after``, dedented."""
    lines = out.splitlines()
    i = next(n for n, ln in enumerate(lines) if after in ln) + 1
    block = []
    while i < len(lines) and lines[i].startswith(" " * 18):
        block.append(lines[i][18:])
        i += 1
    return "\n".join(block)


def test_demo_defaults_are_a_million_token_model_that_takes_claude_codes_first_turn(tmp_path):
    import json
    import tomllib

    import anthropic

    from tests.e2e.helpers import wait_for

    proc, base = _start_demo(tmp_path)
    try:
        assert wait_for(lambda: _learned(base), timeout_s=20), _model_limits(base)
        assert set(_model_limits(base).values()) == {MILLION}
        assert _kv_tokens(base) == [H200_70B_KV_TOKENS] * 2  # a real replica's pool
        client = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
        msg = _claude_code_like(client, 40_000)  # ~40k prompt tokens + 32,000 output cap
        assert msg.usage.input_tokens > 40_000 and msg.content
    finally:
        out = _stop_demo(proc)
    assert f"max_model_len {MILLION:,} tokens, KV pool {H200_70B_KV_TOKENS:,} tokens" in out
    assert f"ANTHROPIC_BASE_URL={base} " in out and "ANTHROPIC_MODEL=mymodel-fast" in out
    assert "docs/agents/" in out
    codex = tomllib.loads(_banner_block(out, "~/.codex/config.toml"))
    assert codex["model_provider"] == "speedgate" and codex["model_context_window"] == MILLION
    assert codex["model_providers"]["speedgate"] == {
        "name": "speedgate", "base_url": base + "/v1", "wire_api": "responses",
        "env_key": "SPEEDGATE_API_KEY"}
    opencode = json.loads(_banner_block(out, "opencode.json"))
    provider = opencode["provider"]["speedgate"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"]["baseURL"] == base + "/v1"
    assert opencode["model"] == "speedgate/mymodel-fast"
    assert provider["models"]["mymodel-fast"]["limit"]["context"] == MILLION


def test_demo_options_size_the_replicas_and_an_overflow_says_so(tmp_path):
    import anthropic

    from tests.e2e.helpers import wait_for

    proc, base = _start_demo(tmp_path, "--max-model-len", "32k", "--kv-size", "64k")
    try:
        assert wait_for(lambda: _learned(base), timeout_s=20), _model_limits(base)
        assert set(_model_limits(base).values()) == {32_768}
        assert _kv_tokens(base) == [65_536] * 2
        client = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
        with pytest.raises(anthropic.BadRequestError) as e:
            _claude_code_like(client, 40_000)
        assert e.value.status_code == 400
        assert e.value.body["error"]["type"] == "invalid_request_error"
        message = e.value.body["error"]["message"]
        assert message.startswith("prompt is too long: ") and message.endswith(
            " tokens > 32768 maximum"), message
    finally:
        out = _stop_demo(proc)
    assert "max_model_len 32,768 tokens, KV pool 65,536 tokens" in out


@pytest.mark.parametrize("args,words", [
    (("--kv-size", "64k"), "does not hold one sequence of --max-model-len 1,048,576"),
    (("--kv-size", "llama-3-70b:tp1"), "no memory left for the KV cache"),
    (("--kv-size", "nope"), "neither a token count"),
])
def test_demo_refuses_sizes_that_hold_no_sequence_before_starting_anything(args, words):
    r = subprocess.run([sys.executable, "-m", "gateway", "demo", "--port", "0", *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and words in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
