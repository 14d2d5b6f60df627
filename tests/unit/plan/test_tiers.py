"""Tier selection order: header, alias, service_tier, default."""

import pytest

from gateway.config import GatewayConfig
from gateway.errors import InvalidRequest, ModelNotFound
from gateway.fleet.pools import PoolRegistry
from gateway.plan.chain import plan_request
from gateway.plan.tiers import ModelIndex


def _cfg(**model_kw):
    model = {
        "default_tier": "standard",
        "aliases": {"m-fast": "fast", "m-auto": "auto"},
        "fallback": {"fast": "standard"},
        "tiers": {
            "standard": {"served_model_name": "m", "endpoints": ["http://127.0.0.1:1"]},
            "fast": {"served_model_name": "m", "endpoints": ["http://127.0.0.1:2"]},
        },
    }
    model.update(model_kw)
    return GatewayConfig(models={"m": model})


@pytest.mark.parametrize(
    ("model", "header", "service_tier", "tier", "source"),
    [
        ("m", None, None, "standard", "default"),
        ("m", None, "priority", "fast", "service_tier"),
        ("m", None, "default", "standard", "service_tier"),
        ("m", None, "flex", "standard", "service_tier"),
        ("m", None, "auto", "auto", "service_tier"),
        ("m-fast", None, "default", "fast", "alias"),
        ("m-auto", None, None, "auto", "alias"),
        ("m-fast", "standard", "priority", "standard", "header"),
        ("m", "FAST", None, "fast", "header"),
    ],
)
def test_first_match_wins(model, header, service_tier, tier, source):
    r = ModelIndex(_cfg()).resolve(model, header, service_tier)
    assert (r.model_name, r.tier, r.source) == ("m", tier, source)


def test_unknown_model_is_404():
    with pytest.raises(ModelNotFound) as ei:
        ModelIndex(_cfg()).resolve("nope", None, None)
    assert ei.value.status == 404 and ei.value.param == "model"


@pytest.mark.parametrize(("header", "st"), [("turbo", None), (None, "ultra"), (None, 3)])
def test_bad_tier_values_are_400(header, st):
    with pytest.raises(InvalidRequest):
        ModelIndex(_cfg()).resolve("m", header, st)


def test_plan_chain_follows_fallback():
    cfg = _cfg()
    pools = PoolRegistry(cfg)
    plan = plan_request(ModelIndex(cfg).resolve("m-fast", None, None), pools)
    assert [p.tier for p in plan.chain] == ["fast", "standard"]
    plan = plan_request(ModelIndex(cfg).resolve("m", None, None), pools)
    assert [p.tier for p in plan.chain] == ["standard"]


def test_auto_prefers_fast_when_idle_and_standard_when_busy():
    cfg = _cfg()
    pools = PoolRegistry(cfg)
    req = ModelIndex(cfg).resolve("m-auto", None, None)
    plan = plan_request(req, pools)
    assert (plan.chain[0].tier, plan.reason) == ("fast", "fast-idle")
    for r in pools.get("m", "fast").replicas:
        r.inflight = 10
    plan = plan_request(req, pools)
    assert (plan.chain[0].tier, plan.reason) == ("standard", "fast-saturated")
    for r in pools.get("m", "fast").replicas:
        r.healthy = False
    assert plan_request(req, pools).reason == "fast-unavailable"


def test_missing_tier_serves_standard():
    cfg = _cfg(tiers={"standard": {"served_model_name": "m", "endpoints": ["http://h:1"]}},
               aliases={}, fallback={})
    plan = plan_request(ModelIndex(cfg).resolve("m", "fast", None), PoolRegistry(cfg))
    assert plan.chain[0].tier == "standard" and plan.reason == "tier-unavailable"
