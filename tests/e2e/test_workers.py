"""``server.workers: 2`` with Redis: the workers of one gateway share rate limits,
usage totals and sessions through Redis, so a client sees one gateway whichever worker
accepts its connection. Requests go on fresh connections, concurrently, so the kernel hands
them to both workers (``speedgate_process_info{pid}`` shows which worker answered a scrape).
The rate-limit bound accounts for the bucket's refill during the test (its own clock, not a
timing assumption)."""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from gateway.admit.auth import new_key
from tests.e2e.stack import MODEL, Stack

REDIS_URL = "redis://127.0.0.1:6379/0"
PREFIX = f"test:e2e-workers:{uuid.uuid4().hex}:"
RPM = 30  # the limited key's requests per minute: bucket of 30, refilled at 0.5 per second
SENT = 2 * RPM  # two unshared buckets would let every one of them through


def _key(key_id: str, **entry: object) -> tuple[str, dict]:
    key, digest = new_key()
    return key, {"id": key_id, "hash": digest, **entry}


KEYS = {"admin": _key("admin", admin=True), "lim": _key("lim", limits={"requests_per_min": RPM})}


def auth(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[name][0]}"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    redis = pytest.importorskip("redis")
    try:
        redis.Redis.from_url(REDIS_URL, socket_timeout=1).ping()
    except Exception:
        pytest.skip("no Redis on 127.0.0.1:6379")
    s = Stack(
        tmp_path_factory.mktemp("workers"), replicas_per_tier=1, tiers=("standard",),
        config_extra={
            "server": {"port": 0, "workers": 2},
            "state": {"redis_url": REDIS_URL, "routing_key_prefix": PREFIX + "route:"},
            "auth": {"keys": [entry for _, entry in KEYS.values()]},
            "rate_limits": {"redis_prefix": PREFIX, "fail_mode": "closed"},
            "responses": {"redis_prefix": PREFIX + "resp:"},
        },
    )
    try:
        s.start()
        yield s
    finally:
        s.stop()
        client = redis.Redis.from_url(REDIS_URL)
        keys = list(client.scan_iter(match=PREFIX + "*"))
        if keys:
            client.delete(*keys)
        client.close()


def fresh() -> httpx.Limits:
    return httpx.Limits(max_keepalive_connections=0)  # one connection per request


async def _pids(url: str, n: int = 40) -> set[str]:
    async with httpx.AsyncClient(base_url=url, limits=fresh(), timeout=10) as c:
        texts = await asyncio.gather(*(c.get("/metrics") for _ in range(n)))
    pids = set()
    for r in texts:
        for line in r.text.splitlines():
            if line.startswith("speedgate_process_info{"):
                pids.add(line.split('pid="')[1].split('"')[0])
    return pids


def test_both_workers_answer(stack: Stack) -> None:
    seen: set[str] = set()
    for _ in range(10):  # each round: 40 concurrent scrapes on fresh connections
        seen |= asyncio.run(_pids(stack.base_url))
        if len(seen) == 2:
            break
    assert len(seen) == 2, seen


def test_rate_limit_and_session_usage_are_shared_by_the_workers(stack: Stack) -> None:
    session = f"s-{uuid.uuid4().hex}"
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

    async def send() -> list[int]:
        headers = {**auth("lim"), "x-session-id": session}
        async with httpx.AsyncClient(base_url=stack.base_url, limits=fresh(),
                                     timeout=30) as c:
            rs = await asyncio.gather(*(c.post("/v1/chat/completions", json=body,
                                               headers=headers) for _ in range(SENT)))
        return [r.status_code for r in rs]

    t0 = time.monotonic()
    statuses = asyncio.run(send())
    refilled = math.ceil((time.monotonic() - t0) * RPM / 60)
    ok = statuses.count(200)
    assert set(statuses) <= {200, 429}, statuses
    assert RPM <= ok <= RPM + refilled, (ok, refilled)  # one bucket, not one per worker

    async def usage() -> list[dict]:
        async with httpx.AsyncClient(base_url=stack.base_url, limits=fresh(),
                                     timeout=10) as c:
            rs = await asyncio.gather(*(c.get("/v1/usage", headers=auth("admin"), params={
                "session_id": session, "key_id": "lim"}) for _ in range(20)))
        return [r.json() for r in rs]

    for doc in asyncio.run(usage()):  # whichever worker answers, every request of the session
        assert doc["requests"] == SENT, doc  # (refused ones included) counted once
        assert doc["errors"] == SENT - ok and doc["output_tokens"] > 0, doc
