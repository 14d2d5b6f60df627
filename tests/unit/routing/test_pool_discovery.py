"""Pools declared by DNS discovery: config rules and replica-list updates that keep state."""

import pytest

from gateway.config import ConfigError, GatewayConfig, load_config
from gateway.fleet.pools import PoolRegistry


def _cfg(pool: dict) -> GatewayConfig:
    return GatewayConfig(models={"m": {"tiers": {"standard": {"served_model_name": "m", **pool}}}})


def test_discovery_instead_of_endpoints():
    cfg = _cfg({"discovery": {"host": "engine-standard", "port": 8000}})
    pool = PoolRegistry(cfg).get("m", "standard")
    assert pool is not None and pool.replicas == []


@pytest.mark.parametrize(
    ("pool", "message"),
    [
        ({}, "at least one endpoint"),
        ({"endpoints": ["http://h:1"], "discovery": {"host": "h", "port": 1}}, "not both"),
    ],
)
def test_exactly_one_of_endpoints_and_discovery(tmp_path, pool, message):
    import yaml

    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(
        {"models": {"m": {"tiers": {"standard": {"served_model_name": "m", **pool}}}}}))
    with pytest.raises(ConfigError) as ei:
        load_config(p)
    assert "models.m.tiers.standard.endpoints" in str(ei.value) and message in str(ei.value)


def test_set_endpoints_keeps_state_of_staying_replicas():
    cfg = _cfg({"discovery": {"host": "h", "port": 8000}})
    pool = PoolRegistry(cfg).get("m", "standard")
    pool.set_endpoints(["http://10.0.0.1:8000", "http://10.0.0.2:8000"])
    a, b = pool.replicas
    a.inflight, b.healthy = 3, False
    pool.set_endpoints(["http://10.0.0.2:8000", "http://10.0.0.3:8000"])
    assert [r.url for r in pool.replicas] == ["http://10.0.0.2:8000", "http://10.0.0.3:8000"]
    assert pool.replicas[0] is b and not b.healthy
    assert pool.replicas[1].healthy and pool.replicas[1].inflight == 0
    assert a not in pool.replicas
