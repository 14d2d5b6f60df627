"""Start simulator replicas as child processes on ports they bind themselves.

``spawn_simulator`` returns at once with a :class:`SimProcess`; ``SimProcess.wait_ready`` reads
the port the simulator bound (``--port 0 --port-file``, see ``engines.procs``) and waits for its
``/health``. Start several, then wait for each: they boot in parallel. ``start_simulator`` does
both for one replica. ``port`` may be given to restart a replica at the URL it had (a chaos test
that kills and restarts "the same" replica); otherwise port 0 is always used.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from engines.procs import die_with_parent, stop_processes, wait_healthy, wait_port_file

DEFAULT_MODEL = "mymodel"


@dataclass
class SimProcess:
    """A simulator child process: ``proc``; ``url`` (``http://host:port``, no ``/v1``) once
    :meth:`wait_ready` returned."""

    proc: subprocess.Popen
    host: str
    port_file: Path
    url: str = ""
    _tmp: Path | None = field(default=None, repr=False)

    def wait_ready(self, timeout_s: float = 30.0) -> str:
        """Block until the simulator reported its port and answers ``/health`` 200; its URL.
        Raises ``RuntimeError`` if it exits or ``timeout_s`` (seconds) pass."""
        if not self.url:
            port = wait_port_file(self.port_file, self.proc, timeout_s)
            self.url = f"http://{self.host}:{port}"
            if self._tmp is not None:
                self.port_file.unlink(missing_ok=True)
                self._tmp.rmdir()
                self._tmp = None
        wait_healthy(self.url, self.proc, timeout_s)
        return self.url


def spawn_simulator(
    mode: str,
    time_scale: float,
    seed: int,
    extra_args: tuple[str, ...] | list[str] = (),
    model: str = DEFAULT_MODEL,
    host: str = "127.0.0.1",
    port: int = 0,
    accept_sim_faults: bool = True,
) -> SimProcess:
    """Start one simulator serving ``model`` (``mode``: standard | speculative; ``time_scale``
    multiplies model delays; ``extra_args``: more ``engines.sim`` flags) on ``port`` (0: a port
    it binds itself). Returns at once; call :meth:`SimProcess.wait_ready`. Its stderr is
    inherited, stdout discarded. ``accept_sim_faults``: honour per-request ``sim_faults``
    (``--accept-sim-faults``; the test stacks script faults that way)."""
    tmp = Path(tempfile.mkdtemp(prefix="speedgate-sim-"))
    port_file = tmp / "port"
    cmd = [
        sys.executable, "-m", "engines.sim",
        "--host", host,
        "--port", str(port),
        "--port-file", str(port_file),
        "--served-model-name", model,
        "--mode", mode,
        "--time-scale", str(time_scale),
        "--seed", str(seed),
        *(["--accept-sim-faults"] if accept_sim_faults else []),
        *extra_args,
    ]
    proc = subprocess.Popen(
        cmd, start_new_session=True, stdout=subprocess.DEVNULL, preexec_fn=die_with_parent
    )
    return SimProcess(proc, host, port_file, _tmp=tmp)


def start_simulator(
    mode: str,
    time_scale: float,
    seed: int,
    extra_args: tuple[str, ...] | list[str] = (),
    model: str = DEFAULT_MODEL,
    host: str = "127.0.0.1",
    port: int = 0,
    timeout_s: float = 30.0,
) -> SimProcess:
    """:func:`spawn_simulator`, then :meth:`SimProcess.wait_ready`: a healthy replica."""
    sim = spawn_simulator(mode, time_scale, seed, extra_args, model, host, port)
    try:
        sim.wait_ready(timeout_s)
    except BaseException:
        stop_processes([sim.proc])
        raise
    return sim
