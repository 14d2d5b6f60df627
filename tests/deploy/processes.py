"""Starting and stopping test processes: own process group, dies with the test run, no orphans."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from pathlib import Path

from engines.procs import die_with_parent, stop_processes, wait_port_file

__all__ = ["start", "start_on_port0", "stop_processes", "wait_http"]


def start(argv: list[str], log: Path, env: dict[str, str] | None = None,
          cwd: Path | None = None) -> subprocess.Popen:
    """Start ``argv`` in its own session with output to ``log`` (stopped by ``stop_processes``)."""
    out = log.open("wb")
    try:
        return subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=cwd,
            preexec_fn=die_with_parent, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
    finally:
        out.close()


def wait_http(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 30) -> None:
    """Poll ``url`` until it answers 200; fail with the process log if it exits or times out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args} exited {proc.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"{url} not up after {timeout_s}s:\n{log.read_text()}")


def start_on_port0(argv: list[str], log: Path, env: dict[str, str] | None = None,
                   cwd: Path | None = None, timeout_s: float = 30) -> tuple[subprocess.Popen, int]:
    """Start a server whose ``argv`` has ``--port N`` (the simulator, ``speedgate serve``) on
    port 0 instead, with ``--port-file``; return the process and the port it bound. Fails with
    the process log when it exits or reports no port in ``timeout_s`` seconds."""
    argv = list(argv)
    argv[argv.index("--port") + 1] = "0"
    port_file = log.with_suffix(".port")
    port_file.unlink(missing_ok=True)
    proc = start([*argv, "--port-file", str(port_file)], log, env=env, cwd=cwd)
    try:
        return proc, wait_port_file(port_file, proc, timeout_s)
    except RuntimeError as e:
        stop_processes([proc])
        raise AssertionError(f"{e}:\n{log.read_text()}") from None
