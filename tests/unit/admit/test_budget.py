"""Session budgets (``gateway.admit.budget``): the arithmetic, the budget in force, the memory
ledger with an injected clock, and the Redis ledger (atomic across clients) on a live Redis."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import pytest

from gateway.admit.budget import (
    BudgetExceeded,
    BudgetUnavailable,
    MemoryBudgetLedger,
    SessionBudgets,
    check,
    estimate_usd,
)
from gateway.config import ApiKeyConfig, Prices, load_config
from gateway.errors import InvalidRequest

HASH = "sha256:" + "1" * 64
MODELS = {"m": {"tiers": {"standard": {"served_model_name": "m", "endpoints": ["http://h:1"]}}}}


def test_check_arithmetic():
    v = check(spent_usd=0.5, reserved_usd=0.2, budget_usd=1.0, soft_share=0.8)
    assert v.admit and not v.soft and v.remaining_usd == pytest.approx(0.3)
    v = check(0.75, 0.1, 1.0, 0.8)
    assert v.admit and v.soft  # 0.85 committed: past the soft share
    v = check(0.9, 0.1, 1.0, 0.8)
    assert not v.admit and v.remaining_usd == 0.0


def test_estimate_at_the_dearest_tier():
    cheap = Prices(input_per_mtok_usd=1, output_per_mtok_usd=2)
    dear = Prices(input_per_mtok_usd=3, output_per_mtok_usd=10)
    assert estimate_usd(1000, 100, [cheap, dear]) == pytest.approx((3000 + 1000) / 1e6)
    assert estimate_usd(1000, 100, []) == 0.0


def test_budget_in_force():
    b = SessionBudgets(load_config(models=MODELS, budgets={"default_session_budget_usd": 5}))
    assert b.budget_for(None, None) == 5
    assert b.budget_for(None, "2.5") == 2.5  # no cap without a key and no global max
    key = ApiKeyConfig(id="k", hash=HASH, session_budget_usd=1, max_session_budget_usd=3)
    assert b.budget_for(key, None) == 1
    assert b.budget_for(key, "2") == 2 and b.budget_for(key, "10") == 3  # capped by the key
    plain = ApiKeyConfig(id="k", hash=HASH, session_budget_usd=1)
    assert b.budget_for(plain, "10") == 1  # without a maximum the header cannot raise it
    for bad in ("-1", "0", "abc", "nan", "inf"):
        with pytest.raises(InvalidRequest):
            b.budget_for(key, bad)
    capped = SessionBudgets(load_config(models=MODELS, budgets={"max_session_budget_usd": 4}))
    assert capped.budget_for(None, "9") == 4


async def test_memory_ledger_reserve_settle_and_expiry():
    t = [0.0]
    led = MemoryBudgetLedger(reservation_ttl_s=60, clock=lambda: t[0])
    ok, before = await led.reserve("k/s", 1.0, 0.4, "r1")
    assert ok and before.spent_usd == 0 and before.reserved_usd == 0
    ok, before = await led.reserve("k/s", 1.0, 0.4, "r2")
    assert ok and before.reserved_usd == pytest.approx(0.4)
    await led.settle("k/s", "r1", 0.3)
    s = await led.read("k/s")
    assert s is not None and (s.spent_usd, s.reserved_usd) == (pytest.approx(0.3),
                                                               pytest.approx(0.4))
    ok, _ = await led.reserve("k/s", 0.7, 0.1, "r3")  # 0.3 + 0.4 >= 0.7
    assert not ok
    t[0] = 61.0  # r2's gateway died: its hold expires
    ok, before = await led.reserve("k/s", 0.7, 0.1, "r4")
    assert ok and before.reserved_usd == 0
    assert await led.read("other") is None


async def test_reserve_refuses_past_the_budget_with_the_remaining_header():
    b = SessionBudgets(load_config(models=MODELS))
    key = ApiKeyConfig(id="k", hash=HASH, session_budget_usd=0.01)
    hold = await b.reserve(key, "sess", None, "m", 0.004, "r1")
    assert hold is not None and not hold.soft and hold.remaining_usd == pytest.approx(0.01)
    await b.settle(hold, 0.009)
    hold2 = await b.reserve(key, "sess", None, "m", 0.004, "r2")
    assert hold2 is not None and hold2.soft  # 90% spent: past the 80% soft share
    await b.settle(hold2, 0.002)
    with pytest.raises(BudgetExceeded) as e:
        await b.reserve(key, "sess", None, "m", 0.004, "r3")
    err = e.value
    assert err.status == 429 and err.code == "session_budget_exceeded"
    assert err.headers()["x-speedgate-session-budget-remaining-usd"] == "0.000000"
    assert err.headers()["x-should-retry"] == "false"
    assert b.refusals == {"m": 1}
    # another key's session of the same name has its own ledger
    other = ApiKeyConfig(id="other", hash=HASH, session_budget_usd=0.01)
    assert await b.reserve(other, "sess", None, "m", 0.004, "r4") is not None
    # no session or no budget: nothing to check
    assert await b.reserve(key, None, None, "m", 1.0, "r5") is None
    assert await b.reserve(None, "sess", None, "m", 1.0, "r6") is None


@contextlib.asynccontextmanager
async def redis_ledgers():
    """A factory of ``RedisBudgetLedger``s on separate clients (as separate gateway processes
    have), sharing a fresh key prefix that is deleted afterwards."""
    redis = pytest.importorskip("redis.asyncio")
    from gateway.admit.budget_redis import RedisBudgetLedger

    prefix = f"test:budget:{uuid.uuid4().hex}:"
    clients = []

    def make() -> RedisBudgetLedger:
        c = redis.Redis.from_url("redis://127.0.0.1:6379/0", socket_timeout=2)
        clients.append(c)
        return RedisBudgetLedger(c, prefix=prefix, reservation_ttl_s=60)

    try:
        await make().client.ping()
    except Exception:
        for c in clients:
            await c.aclose()
        pytest.skip("no Redis on 127.0.0.1:6379")
    try:
        yield make
    finally:
        keys = [k async for k in clients[0].scan_iter(match=prefix + "*")]
        if keys:
            await clients[0].delete(*keys)
        for c in clients:
            await c.aclose()


async def test_redis_ledger_is_atomic_across_gateway_clients():
    """Two gateway processes (two clients) admit turns of one session concurrently: the
    check-and-reserve is one script, so exactly the reservations that fit are admitted."""
    async with redis_ledgers() as make:
        a, b = make(), make()
        results = await asyncio.gather(*[
            (a if i % 2 else b).reserve("k/s", 1.0, 0.3, f"r{i}") for i in range(10)])
        admitted = [ok for ok, _ in results]
        assert sum(admitted) == 4  # committed 0, 0.3, 0.6, 0.9 < 1.0; then 1.2 >= 1.0
        state = await a.read("k/s")
        assert state is not None and state.reserved_usd == pytest.approx(1.2)
        for i, (ok, _) in enumerate(results):
            if ok:
                await b.settle("k/s", f"r{i}", 0.1)
        state = await a.read("k/s")
        assert state is not None
        assert (state.spent_usd, state.reserved_usd, state.budget_usd) == (
            pytest.approx(0.4), 0.0, 1.0)
        assert await a.read("k/none") is None


class _DownLedger(MemoryBudgetLedger):
    async def reserve(self, *args, **kwargs):  # type: ignore[override]
        raise ConnectionError("redis down")


@pytest.mark.parametrize("mode", ["open", "closed"])
async def test_budget_store_down_follows_the_fail_mode(mode):
    b = SessionBudgets(load_config(models=MODELS, budgets={"fail_mode": mode}), _DownLedger())
    key = ApiKeyConfig(id="k", hash=HASH, session_budget_usd=1)
    if mode == "open":
        assert await b.reserve(key, "s", None, "m", 0.1, "r") is None  # admitted unchecked
    else:
        with pytest.raises(BudgetUnavailable) as e:
            await b.reserve(key, "s", None, "m", 0.1, "r")
        assert e.value.status == 503 and e.value.headers()["retry-after"] == "1"


async def _admitted_with_one_request_id(b: SessionBudgets, n: int) -> int:
    """``n`` concurrent requests of one session that all send one ``x-request-id``; how many
    were admitted (each estimated at 0.3 USD against a 1 USD budget)."""
    key = ApiKeyConfig(id="k", hash=HASH, session_budget_usd=1.0)

    async def one() -> bool:
        try:
            return await b.reserve(key, "sess", None, "m", 0.3, "same-id") is not None
        except BudgetExceeded:
            return False

    return sum(await asyncio.gather(*[one() for _ in range(n)]))


async def test_a_reused_request_id_does_not_share_a_budget_hold():
    """Holds are keyed by a gateway-made id: a client that reuses its ``x-request-id`` on
    concurrent requests is admitted exactly as often as with distinct ids (committed 0, 0.3,
    0.6, 0.9 < 1; then 1.2), and each request's settle releases its own hold."""
    b = SessionBudgets(load_config(models=MODELS))
    assert await _admitted_with_one_request_id(b, 20) == 4
    state = await b.ledger.read("k/sess")
    assert state is not None and state.reserved_usd == pytest.approx(1.2)


async def test_a_reused_request_id_does_not_share_a_redis_budget_hold():
    async with redis_ledgers() as make:
        b = SessionBudgets(load_config(models=MODELS), make())
        assert await _admitted_with_one_request_id(b, 20) == 4
        state = await b.ledger.read("k/sess")
        assert state is not None and state.reserved_usd == pytest.approx(1.2)


async def _subagent_spend(b: SessionBudgets) -> None:
    """A budget of $1: the parent spends $0.5, its subagent $0.4; the parent's ledger carries
    both, so the subagent's next $0.2 request is refused by the parent's ledger although the
    subagent's own has room, and the parent itself has $0.1 left."""
    key = ApiKeyConfig(id="k", hash=HASH, session_budget_usd=1)
    h = await b.reserve(key, "main", None, "m", 0.5, "r1")
    await b.settle(h, 0.5)
    h = await b.reserve(key, "main/agent/a1", None, "m", 0.4, "r2", ancestors=["main"])
    assert h is not None and h.also == ("k/main",)
    assert h.remaining_usd == pytest.approx(0.5)  # the least remaining: the parent's
    await b.settle(h, 0.4)
    assert (await b.read("k", "main"))["spent_usd"] == pytest.approx(0.9)
    assert (await b.read("k", "main/agent/a1"))["spent_usd"] == pytest.approx(0.4)
    h = await b.reserve(key, "main/agent/a1", None, "m", 0.05, "r3", ancestors=["main"])
    await b.settle(h, 0.15)  # it cost more than its estimate: the parent is at $1.05
    with pytest.raises(BudgetExceeded):
        await b.reserve(key, "main/agent/a1", None, "m", 0.01, "r4", ancestors=["main"])
    # the refusal by the parent's ledger left no hold on the subagent's own
    assert (await b.read("k", "main/agent/a1"))["reserved_usd"] == 0.0
    late = await b.reserve(key, "solo", None, "m", 0.1, "r5")
    await b.release("k", "main")  # the session ended: its ledger is gone
    await b.release("k", "solo")
    assert await b.read("k", "main") is None
    await b.settle(late, 0.1)  # a request settling after its session ended: nothing back
    assert await b.read("k", "solo") is None


async def test_a_subagents_spend_is_charged_to_its_parent():
    await _subagent_spend(SessionBudgets(load_config(models=MODELS)))


async def test_a_subagents_spend_is_charged_to_its_parent_in_redis():
    async with redis_ledgers() as make:
        ledger = make()
        await _subagent_spend(SessionBudgets(load_config(models=MODELS), ledger))
        assert not await ledger.client.exists(*ledger.keys("k/main"))


async def _grandchild_spend(b: SessionBudgets) -> None:
    """OpenCode names only the direct parent (``x-parent-session-id``): A starts B, B starts
    C. C's requests are charged to A too (B's link to A learned from B's own request), so
    the tree stays within A's $1: before, C spent on past A's budget while A's ledger had
    room (A charged $0.6 of a $1.4 tree)."""
    key = ApiKeyConfig(id="k", hash=HASH, session_budget_usd=1)
    h = await b.reserve(key, "A", None, "m", 0.2, "r1")
    await b.settle(h, 0.2)
    h = await b.reserve(key, "B", None, "m", 0.2, "r2", ancestors=["A"])
    await b.settle(h, 0.2)
    spent = 0.4
    for i in range(5):
        try:
            h = await b.reserve(key, "C", None, "m", 0.2, f"c{i}", ancestors=["B"])
        except BudgetExceeded:
            break
        assert h is not None and h.also == ("k/B", "k/A")
        await b.settle(h, 0.2)
        spent += 0.2
    assert spent == pytest.approx(1.0)
    assert (await b.read("k", "A"))["spent_usd"] == pytest.approx(1.0)
    # a cycle of named parents charges each ledger once and ends
    h = await b.reserve(key, "X", None, "m", 0.1, "x1", ancestors=["Y"])
    h2 = await b.reserve(key, "Y", None, "m", 0.1, "y1", ancestors=["X"])
    assert h is not None and h2 is not None and h2.also == ("k/X",)
    assert (await b.read("k", "X"))["reserved_usd"] == pytest.approx(0.2)


async def test_a_subagents_subagent_is_charged_to_the_whole_tree():
    await _grandchild_spend(SessionBudgets(load_config(models=MODELS)))


async def test_a_subagents_subagent_is_charged_to_the_whole_tree_in_redis():
    async with redis_ledgers() as make:
        await _grandchild_spend(SessionBudgets(load_config(models=MODELS), make()))
