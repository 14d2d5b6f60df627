"""Sessions bound during an outage rebalance once the other replicas are back.

Four simulated replicas; 40 agent sessions start while only one is up (every session binds
there), the other three come back, and the sessions go on turn after turn at modest
concurrency. The replica holding them all sheds its excess, the shortest conversations first,
so active sessions per replica reach max/mean ≤ 1.25 within two turns; after that, and for
sessions started on a healthy pool, no session ever moves.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.e2e.helpers import CHAT, metric, wait_for
from tests.e2e.stack import MODEL, Stack

pytestmark = pytest.mark.e2e

SESSIONS = 40
REPLICAS = 4


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("rebalance"), replicas_per_tier=REPLICAS,
              tiers=("standard",), health={"interval_s": 0.3, "timeout_s": 0.5}).start()
    try:
        yield s
    finally:
        s.stop()


def _usable(stack: Stack) -> int:
    return httpx.get(stack.base_url + "/readyz", timeout=5).json()["models"][MODEL][
        "standard"]["usable"]


def _doc(i: int, turns: int) -> dict:
    """Session ``i`` after ``turns`` turns: its tool output is (i + 1) × 100 characters a turn,
    so the sessions' sizes (what moving each would cost) are all different."""
    msgs = [{"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": f"task {i}"}]
    for t in range(turns):
        msgs += [{"role": "assistant", "content": f"ran step {t}"},
                 {"role": "user", "content": f"output {t} " + "x" * (100 * (i + 1))}]
    return {"model": MODEL, "messages": msgs, "max_tokens": 4}


def _turn(stack: Stack, prefix: str, turn: int) -> dict[int, str]:
    """Turn ``turn`` of every session, 8 at a time: session → replica that served it."""

    def one(i: int) -> tuple[int, str]:
        r = client.post(CHAT, json=_doc(i, turn), headers={"x-session-id": f"{prefix}-{i}"})
        assert r.status_code == 200, r.text
        return i, r.headers["x-speedgate-replica"]

    with httpx.Client(base_url=stack.base_url, timeout=30) as client, ThreadPoolExecutor(8) as ex:
        return dict(ex.map(one, range(SESSIONS)))


def _max_over_mean(where: dict[int, str]) -> float:
    counts = Counter(where.values())
    return max(counts.values()) / (SESSIONS / REPLICAS)


def test_item3_sessions_bound_during_an_outage_rebalance(stack: Stack):
    urls = stack.sims["standard"]
    for url in urls[1:]:
        stack.kill_sim(url, crash=True)
    try:
        assert wait_for(lambda: _usable(stack) == 1, timeout_s=15)
        first = _turn(stack, "outage", 1)
        assert Counter(first.values()) == {f"{MODEL}/standard/0": SESSIONS}
    finally:
        for url in urls[1:]:
            stack.restart_sim(url)
    assert wait_for(lambda: _usable(stack) == REPLICAS, timeout_s=15)
    where, ratios, moves = first, [], []
    for turn in range(2, 6):
        now = _turn(stack, "outage", turn)
        moves.append(sum(now[i] != where[i] for i in range(SESSIONS)))
        ratios.append(_max_over_mean(now))
        where = now
    # within two turns of the recovery the pool is balanced, and then nothing moves
    assert min(ratios[:2]) <= 1.25 and max(ratios[1:]) <= 1.25, (ratios, moves)
    assert moves[2:] == [0, 0], moves
    # the replica that held everything kept the longest conversations: cheapest moved first
    stayed = sorted(i for i in range(SESSIONS) if where[i] == f"{MODEL}/standard/0")
    assert stayed == list(range(SESSIONS - len(stayed), SESSIONS)), stayed
    assert metric(stack, "speedgate_routing_decisions_total", reason="rebalance") == sum(moves)


def test_item3_healthy_steady_state_never_moves_a_session(stack: Stack):
    before = metric(stack, "speedgate_routing_decisions_total", reason="rebalance")
    where = _turn(stack, "steady", 1)
    for turn in range(2, 5):
        assert _turn(stack, "steady", turn) == where
    assert metric(stack, "speedgate_routing_decisions_total", reason="rebalance") == before
