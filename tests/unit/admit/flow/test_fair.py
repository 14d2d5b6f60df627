"""Fair queuing inside a band (``gateway.admit.flow.fair``): arrivals in, order out."""

from __future__ import annotations

import random
from dataclasses import dataclass

from gateway.admit.flow.fair import FairQueue


@dataclass(eq=False)
class Req:
    key: str
    session: str
    cost: float
    n: int = 0


def _drain(q: FairQueue[Req]) -> list[Req]:
    out = []
    while (r := q.pop()) is not None:
        out.append(r)
    return out


def test_a_flooding_key_does_not_delay_a_light_one():
    q: FairQueue[Req] = FairQueue()
    for i in range(100):
        q.push(Req("flood", f"s{i}", 100, i))
    for i in range(5):
        q.push(Req("light", "s", 100, i))
    first = _drain(q)[:10]
    # the light key's 5 requests alternate with the flood's instead of waiting behind 100
    assert [r.key for r in first].count("light") == 5


def test_weights_share_tokens_in_proportion():
    q: FairQueue[Req] = FairQueue()
    for i in range(300):
        q.push(Req("a", "s", 10, i), weight=2.0)
        q.push(Req("b", "s", 10, i), weight=1.0)
    served = [q.pop() for _ in range(300)]
    a = sum(r.cost for r in served if r and r.key == "a")
    b = sum(r.cost for r in served if r and r.key == "b")
    assert abs(a / b - 2.0) < 0.05


def test_shares_are_in_tokens_not_requests():
    q: FairQueue[Req] = FairQueue()
    for i in range(200):
        q.push(Req("big", "s", 1000, i))
        q.push(Req("small", "s", 100, i))
    served = [q.pop() for _ in range(110)]
    tokens = {k: sum(r.cost for r in served if r and r.key == k) for k in ("big", "small")}
    assert abs(tokens["big"] - tokens["small"]) <= 1000 + 100  # SFQ bound: one max request each
    assert sum(1 for r in served if r and r.key == "small") >= 9 * sum(
        1 for r in served if r and r.key == "big")


def test_sessions_of_one_key_share_its_turn():
    q: FairQueue[Req] = FairQueue()
    for i in range(50):
        q.push(Req("k", "runaway", 10, i))
    for i in range(3):
        q.push(Req("k", "calm", 10, i))
    first = _drain(q)[:6]
    assert [r.session for r in first].count("calm") == 3
    # FIFO inside a session
    calm = [r.n for r in first if r.session == "calm"]
    assert calm == sorted(calm)


def test_sfq_fairness_bound_holds_for_random_costs():
    """Goyal et al. 1996, Theorem 1: for two flows backlogged over an interval,
    |W_a/w_a - W_b/w_b| <= c_max_a/w_a + c_max_b/w_b, whatever the costs."""
    rng = random.Random(7)
    q: FairQueue[Req] = FairQueue()
    weights = {"a": 3.0, "b": 1.0}
    cmax = {"a": 0.0, "b": 0.0}
    for i in range(400):
        for k in ("a", "b"):
            c = rng.choice([1, 5, 50, 400])
            cmax[k] = max(cmax[k], c)
            q.push(Req(k, f"s{i % 7}", c, i), weights[k])
    work = {"a": 0.0, "b": 0.0}
    bound = cmax["a"] / weights["a"] + cmax["b"] / weights["b"]
    for _ in range(500):  # both stay backlogged (400 each queued)
        r = q.pop()
        assert r is not None
        work[r.key] += r.cost
        assert abs(work["a"] / weights["a"] - work["b"] / weights["b"]) <= bound + 1e-9


def test_remove_and_peek():
    q: FairQueue[Req] = FairQueue()
    r1, r2, r3 = Req("a", "s", 1), Req("a", "s", 1), Req("b", "s", 1)
    for r in (r1, r2, r3):
        q.push(r)
    assert q.remove(r1) and not q.remove(r1)
    assert len(q) == 2
    assert q.peek() is q.pop()
    assert len(q) == 1
    assert q.remove(r3) or q.remove(r2)
    assert len(q) == 0 and q.pop() is None and q.peek() is None


def test_settle_refunds_a_key_charged_for_tokens_it_did_not_use():
    """An agent that asked for 4,000 tokens and wrote 100 is charged 100 once settled: its
    next request is not held back behind the other key's."""
    def run(settle: bool) -> list[str]:
        q: FairQueue[Req] = FairQueue()
        q.push(Req("agent", "s", 4000))
        q.push(Req("other", "s", 1000))
        assert q.pop().key == "agent"  # type: ignore[union-attr]
        if settle:
            q.settle("agent", "s", 100 - 4000)
        for _ in range(3):
            q.push(Req("agent", "s", 1000))
        q.push(Req("other", "s", 1000))
        return [r.key for r in _drain(q)]

    assert run(settle=False)[:3] == ["other", "other", "agent"]
    assert run(settle=True)[:3] == ["other", "agent", "other"]


def test_idle_flows_are_forgotten():
    q: FairQueue[Req] = FairQueue()
    for i in range(3000):
        q.push(Req(f"k{i}", "s", 1))
        q.pop()
    q.push(Req("z", "s", 1))
    q.pop()
    assert len(q._keys) < 1100  # pruned every 1024 pops
