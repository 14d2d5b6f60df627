"""Start simulator replicas as real subprocesses from tests (the gateway's e2e tests use this).

    with start_sim(time_scale=0, faults={"ttft_delay_s": 1}) as sim:
        httpx.get(sim.url + "/health")

Keyword arguments become flags: ``time_scale=0`` -> ``--time-scale 0``, ``True`` -> a bare flag,
``False``/None -> omitted, dicts and lists -> JSON. The process binds port 0 and reports the
port it got on its ready line (no port race); :func:`start_sim` then waits for ``/health``
(any answer when ``wait_ready=False``, e.g. with ``slow_start_s``) and always kills the process
on exit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from engines.sim.app import READY_LINE

REPO_ROOT = Path(__file__).resolve().parents[2]
_READY_PREFIX = READY_LINE.split("{", 1)[0]


class SimProcess:
    """A running simulator subprocess: ``.url``, ``.port``, ``.proc``; ``.stop()`` kills it."""

    def __init__(self, proc: subprocess.Popen[str], port: int, host: str = "127.0.0.1") -> None:
        self.proc = proc
        self.port = port
        self.host = host
        self.url = f"http://{host}:{port}"

    @property
    def base_url(self) -> str:
        """OpenAI client ``base_url`` (``.../v1``)."""
        return self.url + "/v1"

    def alive(self) -> bool:
        """True while the process runs."""
        return self.proc.poll() is None

    def stop(self, timeout: float = 5.0) -> None:
        """Terminate the process (kill after ``timeout`` seconds); idempotent."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        if self.proc.stdout:
            self.proc.stdout.close()

    def __enter__(self) -> SimProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def sim_args(**flags: Any) -> list[str]:
    """Command-line arguments for ``flags`` (see the module docstring)."""
    args: list[str] = []
    for key, value in flags.items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif isinstance(value, dict | list):
            args += [flag, json.dumps(value)]
        else:
            args += [flag, str(value)]
    return args


def start_sim(*, startup_timeout: float = 20.0, wait_ready: bool = True, **flags: Any
              ) -> SimProcess:
    """Start ``python -m engines.sim --port 0 ...`` and wait until it answers ``/health``."""
    flags.setdefault("port", 0)
    flags.setdefault("host", "127.0.0.1")
    flags.setdefault("accept_sim_faults", True)  # the simulator tests script faults per request
    cmd = [sys.executable, "-m", "engines.sim", *sim_args(**flags)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=None, text=True
    )
    deadline = time.monotonic() + startup_timeout
    try:
        port = _read_port(proc, deadline)
        sim = SimProcess(proc, port, flags["host"])
        _wait_health(sim, deadline, wait_ready)
        return sim
    except BaseException:
        proc.kill()
        proc.wait()
        raise


def _read_port(proc: subprocess.Popen[str], deadline: float) -> int:
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"simulator exited before it was ready (rc={proc.wait()})")
        if line.startswith(_READY_PREFIX):
            return int(line.strip().rsplit("=", 1)[1])
    raise TimeoutError("simulator did not report its port in time")


def _wait_health(sim: SimProcess, deadline: float, wait_ready: bool) -> None:
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(sim.url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except urllib.error.HTTPError:
            if not wait_ready:
                return
        except OSError:
            pass
        if not sim.alive():
            raise RuntimeError("simulator exited during startup")
        time.sleep(0.05)
    raise TimeoutError("simulator did not become healthy in time")
