"""The demo itself as the agents' stack: ``python -m gateway demo`` (what ``make demo`` runs),
with its own defaults, so a default that breaks an agent breaks the agent tests.

:class:`DemoStack` starts ``python -m gateway demo --port 0 --port-file PATH`` plus the options
a test names (``demo_args``: the speed of the simulation, ``--time-scale``, by default; a small
``--max-model-len`` for the overflow tests), reads its simulators' URLs from the demo's banner
and their processes from the demo's children, and offers what the tests use of
:class:`tests.e2e.stack.Stack`: ``base_url``, ``sims``, ``log()`` (the demo's output, the
gateway's access log included), ``reset_sims``, ``kill_sim``, ``restart_sim``, ``stop``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from engines.procs import die_with_parent, spawn_reporting_port, stop_processes, wait_healthy
from tests.e2e.stack import Stack

#: the demo's simulated delays run 50 times faster in the tests (the ratios stay the demo's)
DEMO_TIME_SCALE = "0.02"
_POOL = re.compile(r"^\s+(standard|fast) pool[^:]*: (.+)$", re.M)


@dataclass
class DemoStack(Stack):
    """A running ``speedgate demo`` (see the module docstring); ``demo_args``: extra options of
    ``speedgate demo``."""

    demo_args: tuple[str, ...] = ("--time-scale", DEMO_TIME_SCALE)
    sim_cmds: dict[str, tuple[int, list[str]]] = field(default_factory=dict)  # url: pid, argv

    def start(self) -> DemoStack:
        """Start the demo and wait until its gateway listens; raises ``RuntimeError`` with the
        demo's output when it does not."""
        self.log_path = self.tmp / "demo.log"
        try:
            with self.log_path.open("wb") as log:
                self.gateway, self.base_url = spawn_reporting_port(
                    [sys.executable, "-m", "gateway", "demo", "--port", "0", *self.demo_args],
                    stdout=log, env={**os.environ, "PYTHONUNBUFFERED": "1"}, timeout_s=90)
            self.procs.append(self.gateway)
            self.sims = {tier: [u.strip() for u in urls.split(",")]
                         for tier, urls in _POOL.findall(self.log())}
            by_port = {}
            for child in psutil.Process(self.gateway.pid).children():
                for conn in child.net_connections(kind="tcp"):
                    if conn.status == psutil.CONN_LISTEN:
                        by_port[conn.laddr.port] = (child.pid, child.cmdline())
            for url in self.all_sims():
                self.sim_cmds[url] = by_port[int(url.rsplit(":", 1)[1])]
            self._wait_gateway()
            return self
        except BaseException as e:
            self.stop()
            if isinstance(e, RuntimeError | KeyError):
                raise RuntimeError(f"demo did not start ({e!r}):\n{self.log()}") from None
            raise

    def kill_sim(self, url: str, crash: bool = False) -> None:
        """Stop the demo's simulator at ``url``: SIGKILL with ``crash``, else SIGTERM (it
        drains). A simulator this stack restarted is stopped as its own child."""
        pid = self.sim_cmds[url][0]
        own = self.sim_procs.get(url)
        if own is not None:
            if crash:
                own.kill()
                own.wait()
            else:
                stop_processes([own])
            return
        proc = psutil.Process(pid)
        os.kill(pid, signal.SIGKILL if crash else signal.SIGTERM)
        deadline = time.monotonic() + 10  # gone, or a zombie until the demo reaps it
        while time.monotonic() < deadline:
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    return
            except psutil.NoSuchProcess:
                return
            time.sleep(0.05)
        raise RuntimeError(f"simulator {url} (pid {pid}) still runs")

    def restart_sim(self, url: str) -> None:
        """Start the simulator at ``url`` again, with the demo's own command line on the same
        port (as a restarted pod behind a stable name), as this stack's child; wait for it."""
        _, argv = self.sim_cmds[url]
        argv = list(argv)
        argv[argv.index("--port") + 1] = url.rsplit(":", 1)[1]
        if "--port-file" in argv:
            at = argv.index("--port-file")
            del argv[at:at + 2]
        proc = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.DEVNULL,
                                preexec_fn=die_with_parent)
        self.procs.append(proc)
        self.sim_procs[url] = proc
        self.sim_cmds[url] = (proc.pid, argv)
        wait_healthy(url, proc, 30)


def demo_stack(tmp: Path, *demo_args: str) -> DemoStack:
    """A started :class:`DemoStack` in ``tmp``: the demo's defaults, simulated 50 times faster,
    plus ``demo_args``."""
    return DemoStack(tmp, demo_args=("--time-scale", DEMO_TIME_SCALE, *demo_args)).start()
