"""Endpoints from the Kubernetes API, against a fake API server written for the test: it
answers the pod list and streams watch events the test pushes, as the real one does
(``GET /api/v1/namespaces/{ns}/pods`` with ``labelSelector``, ``watch``, ``resourceVersion``).
One InferencePool's pods hold both tiers (tier by pod label); the picker's pools follow the
list and every event; an expired version (410) relists."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio
from aiohttp import web

from gateway.config import GatewayConfig
from gateway.picker.decide import Picker, endpoint_of
from gateway.picker.grpc_server import picker_protocols
from gateway.picker.kube import pod_ready
from gateway.picker.runtime import PickerRuntime
from tests.e2e.helpers import wait_for
from tests.unit.picker.direct import decide

SELECTOR = "app=vllm-m"


def pod(name: str, ip: str, tier: str | None, ready: bool = True, version: int = 1) -> dict:
    labels = {"app": "vllm-m", **({"speedgate.io/tier": tier} if tier else {})}
    return {"kind": "Pod", "metadata": {"name": name, "labels": labels,
                                        "resourceVersion": str(version)},
            "status": {"podIP": ip, "conditions": [
                {"type": "Ready", "status": "True" if ready else "False"}]}}


class FakeApiServer:
    """Pods of one namespace: ``items`` for the list; ``events`` for the open watch (a None
    ends it; ``gone`` makes the next watch answer 410)."""

    def __init__(self, items: list[dict]) -> None:
        self.items = items
        self.events: asyncio.Queue[dict | None] = asyncio.Queue()
        self.gone = False
        self.lists = 0
        self.selectors: list[str] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def pods(self, request: web.Request) -> web.StreamResponse:
        self.selectors.append(request.query.get("labelSelector", ""))
        if request.query.get("watch") != "true":
            self.lists += 1
            return web.json_response({"kind": "PodList", "items": self.items,
                                      "metadata": {"resourceVersion": "10"}})
        if self.gone:
            self.gone = False
            return web.json_response({"kind": "Status", "code": 410}, status=410)
        resp = web.StreamResponse()
        await resp.prepare(request)
        while (event := await self.events.get()) is not None:
            await resp.write(json.dumps(event).encode() + b"\n")
        await resp.write_eof()
        return resp

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/ns1/pods", self.pods)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        await self.events.put(None)
        assert self.runner is not None
        await self.runner.cleanup()


def _config() -> GatewayConfig:
    tier = {"served_model_name": "m", "endpoints": ["http://127.0.0.9:1"]}  # until the list
    return GatewayConfig(
        health={"interval_s": 3600, "unhealthy_threshold": 5},
        models={"m": {"aliases": {"m-fast": "fast"}, "fallback": {"fast": "standard"},
                      "tiers": {"standard": tier, "fast": tier}}},
    )


@pytest_asyncio.fixture(loop_scope="function")
async def setup() -> AsyncIterator[tuple[FakeApiServer, PickerRuntime]]:
    api = FakeApiServer([pod("s0", "127.0.0.1", "standard"), pod("f0", "127.0.0.2", "fast"),
                         pod("u0", "127.0.0.3", None), pod("s1", "127.0.0.4", "standard",
                                                           ready=False)])
    await api.start()
    rt = PickerRuntime.build(_config())
    rt.watch_pods("m", api.url, "ns1", SELECTOR, 8000, retry_s=0.05)
    await rt.start()
    try:
        yield api, rt
    finally:
        await rt.stop()
        await api.stop()


def _urls(rt: PickerRuntime, tier: str) -> list[str]:
    pool = rt.pools.get("m", tier)
    assert pool is not None
    return sorted(r.url for r in pool.replicas)


async def _until(pred: Any) -> None:
    for _ in range(200):
        if pred():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def test_pods_by_tier_label_and_watch_events(setup: Any) -> None:
    api, rt = setup
    assert api.selectors[0] == SELECTOR
    # ready pods only; the unlabelled one takes the model's default tier (standard)
    assert _urls(rt, "standard") == ["http://127.0.0.1:8000", "http://127.0.0.3:8000"]
    assert _urls(rt, "fast") == ["http://127.0.0.2:8000"]
    await api.events.put({"type": "ADDED", "object": pod("f1", "127.0.0.5", "fast", version=11)})
    await _until(lambda: len(_urls(rt, "fast")) == 2)
    await api.events.put({"type": "MODIFIED",
                          "object": pod("s1", "127.0.0.4", "standard", version=12)})
    await _until(lambda: "http://127.0.0.4:8000" in _urls(rt, "standard"))
    await api.events.put({"type": "MODIFIED",
                          "object": pod("s0", "127.0.0.1", "standard", ready=False, version=13)})
    await _until(lambda: "http://127.0.0.1:8000" not in _urls(rt, "standard"))
    await api.events.put({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "14"}}})
    await api.events.put({"type": "DELETED", "object": pod("f0", "127.0.0.2", "fast")})
    await _until(lambda: _urls(rt, "fast") == ["http://127.0.0.5:8000"])


async def test_replica_state_survives_an_update_and_410_relists(setup: Any) -> None:
    api, rt = setup
    fast = rt.pools.get("m", "fast")
    assert fast is not None
    kept = fast.replicas[0]
    kept.inflight = 3
    api.gone = True
    await api.events.put(None)  # the server ends the watch; the next one is 410: relist
    api.items = [*api.items, pod("f1", "127.0.0.5", "fast")]
    await _until(lambda: len(_urls(rt, "fast")) == 2)
    assert api.lists == 2 and rt.pod_watches[0].relists == 1
    assert kept in fast.replicas and kept.inflight == 3  # same replica object, state kept


async def test_picks_follow_the_pods(setup: Any) -> None:
    _, rt = setup
    picker = Picker(rt, picker_protocols())
    body = json.dumps({"model": "m-fast", "max_tokens": 2,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    pick = await decide(picker, {":path": "/v1/chat/completions"}, body)
    assert endpoint_of(pick.endpoints[0]) == "127.0.0.2:8000"
    assert pick.rec.served_tier == "fast"
    await picker.finish(pick, None)
    assert wait_for(lambda: pick.endpoints[0].inflight == 0, timeout_s=1)


def test_pods_without_ip_or_terminating_are_not_endpoints() -> None:
    no_ip = pod("x", "", "fast")
    terminating = pod("y", "1.2.3.4", "fast")
    terminating["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert pod_ready(pod("z", "1.2.3.4", "fast"))
    assert not pod_ready(no_ip) and not pod_ready(terminating)
