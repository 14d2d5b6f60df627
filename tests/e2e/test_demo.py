"""``speedgate demo`` serves real requests and leaves no engine process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import openai
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


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_demo_serves_and_stops_cleanly(sig: signal.Signals, tmp_path):
    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "demo", "--port", "0", "--port-file", str(port_file),
         "--replicas", "1", "--time-scale", "0.01"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        preexec_fn=die_with_parent,
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
