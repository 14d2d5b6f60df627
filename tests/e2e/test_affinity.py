"""Sessions and prefix-cache affinity across two gateway processes sharing the real Redis
(cases affinity-across-replicas and redis-outage, ../shared/cases/failure-cases.md).

Redis is reached through a black-holing proxy, so the outage never touches the shared server;
keys use a unique prefix per module and are deleted at the end.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
import redis

from tests.e2e.blackhole_proxy import BlackholeProxy
from tests.e2e.stack import MODEL, Stack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, str, BlackholeProxy]]:
    prefix = f"test:affinity:{uuid.uuid4().hex[:8]}:"
    proxy = BlackholeProxy(("127.0.0.1", 6379)).start()
    stack = Stack(
        tmp_path_factory.mktemp("affinity"),
        replicas_per_tier=3,
        health={"interval_s": 0.3, "timeout_s": 0.5},
        config_extra={"state": {"redis_url": proxy.url, "routing_key_prefix": prefix,
                                "breaker_cooldown_s": 1.0}},
    )
    try:
        stack.start()
        second = stack.add_gateway()
        yield stack, second, proxy
    finally:
        stack.stop()
        proxy.stop()
        r = redis.Redis(host="127.0.0.1", port=6379)
        keys = list(r.scan_iter(match=prefix + "*", count=1000))
        if keys:
            r.delete(*keys)
        r.close()


def _doc(task: str, turns: int) -> dict:
    msgs = [{"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": f"task {task}"}]
    for i in range(turns):
        msgs += [{"role": "assistant", "content": f"ran step {i}"},
                 {"role": "user", "content": f"tool output {i} " * 200}]
    return {"model": MODEL, "messages": msgs, "max_tokens": 4}


def _turn(url: str, doc: dict, session: str | None) -> str:
    headers = {"x-session-id": session} if session else {}
    r = httpx.post(url + "/v1/chat/completions", json=doc, headers=headers, timeout=20)
    assert r.status_code == 200, r.text
    return r.headers["x-speedgate-replica"]


@pytest.mark.parametrize("with_header", [True, False])
def test_affinity_across_replicas(env, with_header):
    stack, second, _ = env
    task = uuid.uuid4().hex
    session = f"s-{task}" if with_header else None
    gws = [stack.base_url, second]
    got = [_turn(gws[t % 2], _doc(task, t), session) for t in range(4)]
    assert len(set(got)) == 1, got


def test_affinity_across_replicas_rebinds_when_unhealthy(env):
    stack, second, _ = env
    task = uuid.uuid4().hex
    first = _turn(stack.base_url, _doc(task, 0), None)
    assert _turn(second, _doc(task, 1), None) == first
    url = stack.sims["standard"][int(first.rsplit("/", 1)[1])]
    stack.kill_sim(url, crash=True)
    try:
        moved = _turn(stack.base_url, _doc(task, 2), None)  # retried elsewhere, rebinds
        assert moved != first
        assert _turn(second, _doc(task, 3), None) == moved
        assert _turn(stack.base_url, _doc(task, 4), None) == moved
    finally:
        stack.restart_sim(url)


def _ready(url: str) -> dict:
    r = httpx.get(url + "/readyz", timeout=5)
    assert r.status_code == 200
    return r.json()


def _wait(pred, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


def test_redis_outage_routing_continues_degraded_then_recovers(env):
    stack, second, proxy = env
    proxy.blackhole.set()
    try:
        # every request still served; after the breaker opens both gateways agree (hashing)
        for t in range(4):
            _turn(stack.base_url, _doc("warmup-" + str(t), 0), None)
            _turn(second, _doc("warmup-" + str(t), 0), None)
        assert _wait(lambda: _ready(stack.base_url)["status"] == "degraded")
        assert _ready(second)["degraded"] is True
        task = uuid.uuid4().hex
        got = {_turn([stack.base_url, second][t % 2], _doc(task, t), f"o-{task}")
               for t in range(4)}
        assert len(got) == 1, got
        metrics = httpx.get(stack.base_url + "/metrics").text
        assert "speedgate_state_store_degraded 1.0" in metrics
        assert 'reason="hash_fallback"' in metrics
    finally:
        proxy.blackhole.clear()
    # recovery without traffic: the watcher pings Redis once the cooldown passes
    assert _wait(lambda: _ready(stack.base_url)["status"] == "ready", 20)
    assert _wait(lambda: _ready(second)["status"] == "ready", 20)
    task = uuid.uuid4().hex
    got = {_turn([stack.base_url, second][t % 2], _doc(task, t), None) for t in range(3)}
    assert len(got) == 1
