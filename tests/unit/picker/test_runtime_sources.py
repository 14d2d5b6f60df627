"""The picker's endpoint sources other than Kubernetes: static ``endpoints`` from the config,
and DNS ``discovery`` (the name resolved at start, before readiness)."""

from __future__ import annotations

import json

from gateway.config import GatewayConfig
from gateway.picker.decide import Picker, endpoint_of
from gateway.picker.grpc_server import picker_protocols
from gateway.picker.runtime import PickerRuntime
from tests.unit.picker.direct import decide

BODY = json.dumps({"model": "m", "max_tokens": 2,
                   "messages": [{"role": "user", "content": "hi"}]}).encode()


async def test_static_and_dns_endpoints() -> None:
    cfg = GatewayConfig(
        health={"interval_s": 3600, "unhealthy_threshold": 5},
        models={"m": {"fallback": {"fast": "standard"}, "tiers": {
            "standard": {"served_model_name": "m",
                         "discovery": {"host": "localhost", "port": 8123, "family": "ipv4"}},
            "fast": {"served_model_name": "m", "endpoints": ["http://127.0.0.7:9000"]},
        }}},
    )
    rt = PickerRuntime.build(cfg)
    assert not rt.ready
    await rt.start()
    try:
        assert rt.ready
        std, fast = rt.pools.get("m", "standard"), rt.pools.get("m", "fast")
        assert std is not None and fast is not None
        assert [r.url for r in std.replicas] == ["http://127.0.0.1:8123"]
        picker = Picker(rt, picker_protocols())
        pick = await decide(picker, {":path": "/v1/chat/completions"}, BODY)
        assert endpoint_of(pick.endpoints[0]) == "127.0.0.1:8123"
        await picker.finish(pick, None)
        pick = await decide(picker, {":path": "/v1/chat/completions",
                                  "x-speedgate-tier": "fast"}, BODY)
        assert endpoint_of(pick.endpoints[0]) == "127.0.0.7:9000"
        await picker.finish(pick, None)
    finally:
        await rt.stop()


async def test_usage_charged_exact_or_estimated() -> None:
    """A 2xx whose usage the picker saw is charged that usage; one whose response body the
    picker never saw is charged the admission estimate (prompt bytes / 4, the output cap),
    never refunded; a failed one is charged nothing."""
    from gateway.common.usage import Usage

    cfg = GatewayConfig(
        health={"interval_s": 3600, "unhealthy_threshold": 5},
        models={"m": {"tiers": {"standard": {
            "served_model_name": "m", "endpoints": ["http://127.0.0.7:9000"],
            "prices": {"input_per_mtok_usd": 1.0, "output_per_mtok_usd": 2.0}}}}},
    )
    rt = PickerRuntime.build(cfg)
    await rt.start()
    try:
        picker = Picker(rt, picker_protocols())
        headers = {":path": "/v1/chat/completions"}
        seen = await decide(picker, headers, BODY)
        await picker.served(seen, "127.0.0.7:9000", 200)
        await picker.finish(seen, Usage(prompt=10, completion=3))
        assert seen.rec.usage == Usage(prompt=10, completion=3) and not seen.rec.usage_estimated
        unseen = await decide(picker, headers, BODY)
        await picker.served(unseen, "127.0.0.7:9000", 200)
        await picker.finish(unseen, None)
        assert unseen.rec.usage_estimated
        assert unseen.rec.usage == Usage(prompt=len(BODY) // 4, completion=2)
        assert unseen.rec.cost_usd and unseen.rec.cost_usd > 0
        failed = await decide(picker, headers, BODY)
        await picker.served(failed, "127.0.0.7:9000", 502)
        await picker.finish(failed, None)
        assert failed.rec.usage is None and not failed.rec.cost_usd
    finally:
        await rt.stop()
