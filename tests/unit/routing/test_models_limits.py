"""``/v1/models``' ``max_model_len``: per name, the smallest learned limit among the replicas a
request for it may reach; absent while none is known."""

from __future__ import annotations

from fastapi import FastAPI
from starlette.testclient import TestClient

from gateway.config import GatewayConfig
from gateway.fleet.pools import PoolRegistry
from gateway.plan.tiers import ModelIndex
from gateway.routes.models import add_model_routes


def _app() -> tuple[TestClient, PoolRegistry]:
    config = GatewayConfig(models={"m": {
        "aliases": {"m-fast": "fast", "m-standard": "standard", "m-auto": "auto"},
        "tiers": {"standard": {"served_model_name": "m",
                                  "endpoints": ["http://s0:8000", "http://s1:8000"]},
                  "fast": {"served_model_name": "m", "endpoints": ["http://f0:8000"]}},
    }})
    pools = PoolRegistry(config)
    app = FastAPI()
    add_model_routes(app, config, ModelIndex(config), lambda scope: None, pools)
    return TestClient(app), pools


def _limits(client: TestClient) -> dict[str, int | None]:
    return {m["id"]: m.get("max_model_len") for m in client.get("/v1/models").json()["data"]}


def test_limits_per_tier_and_the_smallest_for_the_model() -> None:
    client, pools = _app()
    assert set(_limits(client).values()) == {None}  # nothing probed yet: no invented number
    std, fast = pools.get("m", "standard"), pools.get("m", "fast")
    assert std is not None and fast is not None
    std.replicas[0].max_model_len = 1_048_576
    assert _limits(client) == {"m": 1_048_576, "m-auto": 1_048_576, "m-fast": None,
                               "m-standard": 1_048_576}
    std.replicas[1].max_model_len = 131_072
    fast.replicas[0].max_model_len = 262_144
    fast.replicas[0].kv_num_blocks, fast.replicas[0].kv_block_size = 10_000, 16  # pool 160k
    assert _limits(client) == {"m": 131_072, "m-auto": 131_072, "m-fast": 160_000,
                               "m-standard": 131_072}
    assert client.get("/v1/models/m-fast").json()["max_model_len"] == 160_000
