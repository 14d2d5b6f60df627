"""Child processes for the engines, the demo, the tests and the benchmarks: start them on a port
the child binds itself, tie their life to ours, stop them.

No server here is started on a port chosen free beforehand (a port released and bound later is
a race another process can win: ``address already in use`` on a busy machine). A server that can
bind port 0 does, and writes the port it got to a *port file* (``write_port_file``); the parent
reads it back (``wait_port_file``). A server that cannot report its port (vLLM) is retried on a
fresh port when it fails to bind (``engines.vllm.launcher``).

Standard library only: the simulator, the vLLM launcher and the gateway's demo all use it, and
``engines`` never imports ``gateway``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import IO, Any


def die_with_parent() -> None:
    """In a child process (``preexec_fn``): get SIGTERM when the parent dies, even by SIGKILL,
    so no engine process outlives the demo or a test run (Linux ``PR_SET_PDEATHSIG``)."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now. Only for servers that cannot bind port 0 and
    report it (vLLM), and only with a retry when the bind fails later."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def write_port_file(path: str | os.PathLike[str], port: int) -> None:
    """Write ``port`` to ``path`` atomically (a temp file renamed), so a reader never sees a
    half-written number."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    tmp.write_text(f"{port}\n")
    tmp.replace(p)


def wait_port_file(
    path: str | os.PathLike[str], proc: subprocess.Popen, timeout_s: float = 30.0
) -> int:
    """The port a child wrote to ``path`` (``write_port_file``). Raises ``RuntimeError`` if
    ``proc`` exits first or ``timeout_s`` (seconds) pass."""
    p = Path(path)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            text = p.read_text().strip()
        except FileNotFoundError:
            text = ""
        if text:
            return int(text)
        if proc.poll() is not None:
            raise RuntimeError(f"process {proc.args!r} exited with status {proc.returncode} "
                               "before it reported its port")
        time.sleep(0.05)
    raise RuntimeError(f"process {proc.args!r} reported no port within {timeout_s:.0f}s")


def wait_healthy(
    url: str, proc: subprocess.Popen, timeout_s: float = 30.0, path: str = "/health"
) -> None:
    """Poll ``url + path`` until 200. Raises ``RuntimeError`` if the process exits or the
    timeout (seconds) passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server at {url} exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(url + path, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"server at {url} not healthy after {timeout_s:.0f}s")


def stop_processes(procs: list[subprocess.Popen], grace_s: float = 5.0) -> None:
    """SIGTERM each process group, then SIGKILL what is still alive after ``grace_s``."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def spawn_reporting_port(
    cmd: list[str],
    *,
    stdout: int | IO[Any] | None = subprocess.DEVNULL,
    env: dict[str, str] | None = None,
    timeout_s: float = 30.0,
    host: str = "127.0.0.1",
) -> tuple[subprocess.Popen, str]:
    """Start ``cmd + ['--port-file', PATH]`` (a server given ``--port 0`` that writes its bound
    port there: the simulator, ``speedgate serve``) in its own process group, dying with this
    process; wait for the port. Returns the process and ``http://host:port``. ``stdout``: a file
    object or ``subprocess`` constant (stderr goes with it unless it is DEVNULL). Raises
    ``RuntimeError`` (the process is stopped) if it exits or reports nothing in ``timeout_s``."""
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="speedgate-port-"))
    port_file = tmp / "port"
    proc = subprocess.Popen(
        [*cmd, "--port-file", str(port_file)],
        stdout=stdout,
        stderr=None if stdout is subprocess.DEVNULL else subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=die_with_parent,
        env=env,
    )
    try:
        port = wait_port_file(port_file, proc, timeout_s)
    except BaseException:
        stop_processes([proc])
        raise
    finally:
        port_file.unlink(missing_ok=True)
        tmp.rmdir()
    return proc, f"http://{host}:{port}"
