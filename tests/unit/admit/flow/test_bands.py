"""A request's priority band (``gateway.admit.flow.bands``) and the slots each band may use
(``gateway.admit.flow.saturation``)."""

from __future__ import annotations

import pytest

from gateway.admit.auth import PermissionDenied
from gateway.admit.flow.bands import resolve_band
from gateway.admit.flow.saturation import band_limits
from gateway.config import ApiKeyConfig, FlowControlConfig, load_config
from gateway.config.load import ConfigError
from gateway.errors import InvalidRequest

FLOW = FlowControlConfig()
HASH = "sha256:" + "0" * 64


def key(**kw) -> ApiKeyConfig:
    return ApiKeyConfig(id="k", hash=HASH, **kw)


def test_default_band_and_key_default():
    assert resolve_band(FLOW, None, None, None).name == "standard"
    b = resolve_band(FLOW, key(default_band="batch"), None, None)
    assert (b.name, b.index, b.source, b.flex) == ("batch", 2, "key", False)


def test_service_tier_priority_and_flex():
    p = resolve_band(FLOW, None, None, "priority")
    assert (p.name, p.flex, p.source) == ("interactive", False, "service_tier")
    f = resolve_band(FLOW, None, None, "flex")
    assert (f.name, f.flex) == ("batch", True)
    assert resolve_band(FLOW, key(default_band="batch"), None, "default").name == "batch"


def test_header_wins_and_is_limited_by_the_key():
    b = resolve_band(FLOW, key(bands=["standard", "batch"]), " Batch ", "priority")
    assert (b.name, b.source, b.flex) == ("batch", "header", False)
    with pytest.raises(PermissionDenied) as e:
        resolve_band(FLOW, key(bands=["standard", "batch"]), "interactive", None)
    assert e.value.status == 403 and e.value.code == "priority_not_allowed"
    with pytest.raises(InvalidRequest) as e2:
        resolve_band(FLOW, None, "urgent", None)
    assert e2.value.status == 400 and e2.value.param == "x-speedgate-priority"


def test_implicit_bands_are_narrowed_not_refused():
    # a batch-only key asking service_tier priority is served as batch (lower first)...
    assert resolve_band(FLOW, key(bands=["batch"]), None, "priority").name == "batch"
    # ...and an interactive-only key's flex request goes up to its only band
    assert resolve_band(FLOW, key(bands=["interactive"]), None, "flex").name == "interactive"


def test_band_names_come_from_config():
    flow = FlowControlConfig(bands=[{"name": "gold"}, {"name": "bronze"}], default_band="bronze",
                             service_tier_bands={"priority": "gold", "flex": "bronze"})
    assert resolve_band(flow, None, "gold", None).index == 0
    with pytest.raises(ValueError):
        FlowControlConfig(bands=[{"name": "gold"}], default_band="silver")
    models = {"m": {"tiers": {"standard": {"served_model_name": "m",
                                           "endpoints": ["http://h:1"]}}}}
    with pytest.raises(ConfigError, match="not a flow_control band"):
        load_config(models=models, auth={"keys": [{"id": "k", "hash": HASH, "bands": ["vip"]}]})


def test_band_limits_reserve_slots_for_higher_bands():
    assert band_limits(20, [0.1, 0.0, 0.0]) == [20, 18, 18]
    assert band_limits(20, [0.1, 0.2, 0.0]) == [20, 18, 14]
    # nearest slot, halves up: 10% of 2 slots reserves none (ceil reserved 1 of 2)
    assert band_limits(2, [0.1, 0.0, 0.0]) == [2, 2, 2]
    assert band_limits(4, [0.1, 0.0]) == [4, 4]
    assert band_limits(5, [0.1, 0.0]) == [5, 4]  # half a slot: reserved
    assert band_limits(8, [0.1, 0.0]) == [8, 7]
    assert band_limits(2, [0.5, 0.0]) == [2, 1]  # a tiny pool asks for its slot
    assert band_limits(10, [0.1, 0.2, 0.0]) == [10, 9, 7]
    assert band_limits(1, [0.5, 0.0]) == [1, 1]  # never every slot
    assert band_limits(0, [0.1, 0.0]) == [0, 0]


def test_a_reservation_in_use_frees_the_lower_bands():
    """Reserved slots a band holds count against its reservation: the lower bands may then
    fill every slot but the reservation's unused part (work-conserving), and a band holding
    more than its own reservation frees nothing of another band's."""
    assert band_limits(32, [0.0625, 0.0, 0.0], [0, 0, 30]) == [32, 30, 30]
    assert band_limits(32, [0.0625, 0.0, 0.0], [1, 0, 29]) == [32, 31, 31]
    assert band_limits(32, [0.0625, 0.0, 0.0], [2, 0, 28]) == [32, 32, 32]
    assert band_limits(32, [0.0625, 0.0, 0.0], [5, 0, 20]) == [32, 32, 32]
    # two reservations: band 1 over its own share leaves band 0's unused reservation held
    assert band_limits(10, [0.2, 0.2, 0.0], [0, 5, 0]) == [10, 8, 8]
    assert band_limits(10, [0.2, 0.2, 0.0], [1, 1, 0]) == [10, 9, 8]
    assert band_limits(10, [0.2, 0.2, 0.0], None) == band_limits(10, [0.2, 0.2, 0.0])
    assert band_limits(1, [0.5, 0.0], [1, 0]) == [1, 1]
