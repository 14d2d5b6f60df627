"""Fixed: "new sessions piled 7/3/0/0 on four replicas": the active sessions that the
bounded-load rule counts are shared by every gateway replica through Redis, tested with two
gateway processes in front of four replicas per tier.

Each session opens with its own task (no shared prefix pulls it anywhere), so a new session is
bound by load alone: the emptiest replica by active sessions, the session's consistent-hash
order breaking ties. Gateway A binds two sessions; gateway B then binds sessions whose hash
order puts one of A's two replicas first. With a per-process ledger B sees four empty replicas
and follows the hash onto an occupied one; with the shared ledger it sees A's sessions and
takes an empty replica.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest
import redis

from gateway.fleet.pools import Replica
from gateway.routing.hashring import hash_order
from tests.e2e.stack import MODEL, Stack

pytestmark = pytest.mark.e2e
POOL = f"{MODEL}/standard"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, str, str]]:
    prefix = f"test:ledger:{uuid.uuid4().hex[:8]}:"
    stack = Stack(
        tmp_path_factory.mktemp("ledger"),
        replicas_per_tier=4,
        config_extra={"state": {"redis_url": "redis://127.0.0.1:6379/0",
                                "routing_key_prefix": prefix}},
    )
    try:
        stack.start()
        yield stack, stack.base_url, stack.add_gateway()
    finally:
        stack.stop()
        r = redis.Redis(host="127.0.0.1", port=6379)
        keys = list(r.scan_iter(match=prefix + "*", count=1000))
        if keys:
            r.delete(*keys)
        r.close()


def _new_session(url: str, session: str) -> str:
    """One first turn of ``session`` on the standard pool through gateway ``url``; the replica
    that served it."""
    doc = {"model": MODEL, "max_tokens": 2,
           "messages": [{"role": "user", "content": f"task {session}: fix the build"}]}
    r = httpx.post(url + "/v1/chat/completions", json=doc, timeout=20,
                   headers={"x-session-id": session, "x-speedgate-tier": "standard"})
    assert r.status_code == 200, r.text
    return r.headers["x-speedgate-replica"]


def _hash_home(session: str) -> str:
    """The session's first replica in its consistent-hash order (as every gateway computes)."""
    replicas = [Replica(f"http://r{i}", POOL, name=f"{POOL}/{i}") for i in range(4)]
    return hash_order("h:" + session, replicas)[0].name


def test_new_sessions_are_bounded_across_two_gateways(env):
    _stack, gw_a, gw_b = env
    tag = uuid.uuid4().hex[:6]
    on_a = {_new_session(gw_a, f"{tag}-a{i}") for i in range(2)}
    assert len(on_a) == 2  # gateway A spreads its own two sessions
    # sessions whose hash home is one of A's replicas: B follows the hash only if blind to them
    candidates = (f"{tag}-b{i}" for i in range(1000))
    picked = [s for s in candidates if _hash_home(s) in on_a][:2]
    on_b = [_new_session(gw_b, s) for s in picked]
    assert not set(on_b) & on_a, f"B put new sessions on A's replicas: {on_b} vs {on_a}"
    assert len(set(on_b)) == 2  # and spread its own
    # eight more sessions alternating between the gateways: the shared count keeps them level
    placed = Counter(on_a) + Counter(on_b)
    for i in range(8):
        placed[_new_session(gw_a if i % 2 else gw_b, f"{tag}-c{i}")] += 1
    assert sorted(placed.values()) == [3, 3, 3, 3], placed
