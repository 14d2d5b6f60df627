"""Routing pipeline: scorers, weights, bounded load and spill, store fallback, exclusion."""

import asyncio
import math
import random
import time
from collections import Counter

import pytest

from gateway.config import PoolConfig, RoutingConfig
from gateway.fleet.pools import Pool, Replica, replica_load
from gateway.routing import RouteRequest
from gateway.routing.filters import load_bound, overloaded, under_bound
from gateway.routing.hashring import hash_order
from gateway.routing.picker import pick_best, weighted_scores
from gateway.routing.pipeline import PoolRouter
from gateway.routing.scorers import SCORERS, ScoreContext
from gateway.routing.session_ledger import SessionLedger
from gateway.routing.store import Lookup, MemoryRoutingStore
from gateway.upstream.load_scraper import apply_engine_metrics, parse_engine_metrics


def _pool(n: int = 4, **routing) -> Pool:
    cfg = PoolConfig(endpoints=[f"http://10.0.0.{i}:8000" for i in range(n)],
                     served_model_name="m", routing=RoutingConfig(**routing))
    p = Pool("m", "standard", cfg)
    p.replicas = [Replica(u, p.key, name=f"{p.key}/{i}") for i, u in enumerate(cfg.endpoint_urls())]
    return p


def _doc(turns: int, task: str = "task A") -> dict:
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": task}]
    for i in range(turns):
        msgs += [{"role": "assistant", "content": f"step {i}"},
                 {"role": "user", "content": f"result {i} " * 300}]
    return {"messages": msgs}


def test_scorers_table():
    rs = _pool(3).replicas
    look = Lookup(session=rs[1].name, depth={rs[0].name: 5, rs[2].name: 10})
    ctx = ScoreContext(look, 10, [rs[2], rs[0], rs[1]], {rs[0]: 0, rs[1]: 3, rs[2]: 1})
    assert SCORERS["prefix"](ctx, rs) == [0.5, 0.0, 1.0]
    assert SCORERS["session"](ctx, rs) == [0.0, 1.0, 0.0]
    assert SCORERS["hash"](ctx, rs) == [0.5, 0.0, 1.0]
    load = SCORERS["load"](ctx, rs)
    assert load[0] == pytest.approx(1.0) and load[1] == pytest.approx(0.4)
    for name in SCORERS:
        assert all(0.0 <= s <= 1.0 for s in SCORERS[name](ctx, rs))


def test_weights_decide_between_prefix_and_session():
    rs = _pool(2).replicas
    ctx = ScoreContext(Lookup(session=rs[1].name, depth={rs[0].name: 8}), 10, list(rs))
    assert pick_best(rs, weighted_scores(ctx, rs, {"prefix": 3, "session": 2})) is rs[0]
    assert pick_best(rs, weighted_scores(ctx, rs, {"prefix": 1, "session": 2})) is rs[1]
    assert weighted_scores(ctx, rs, {"prefix": 0, "session": 0}) == [0.0, 0.0]


def test_ties_break_at_random():
    rs = _pool(3).replicas
    picks = {pick_best(rs, [1.0, 1.0, 0.5], random.Random(s)).name for s in range(30)}
    assert picks == {rs[0].name, rs[1].name}


def test_bounded_load_rule():
    assert load_bound([0, 0, 0, 0], 1.25) == 1
    assert load_bound([10, 10, 10, 10], 1.25) == 13  # ceil(1.25 * 41 / 4)
    rs = _pool(4).replicas
    loads = dict(zip(rs, [20, 10, 10, 0], strict=True))
    assert under_bound(rs, loads, 1.25) == rs[1:]  # 20 + 1 > ceil(1.25 * 41 / 4) = 13
    assert under_bound(rs, loads, 0) == rs  # off


def test_session_spills_along_its_hash_order_and_the_table_follows():
    async def run():
        pool = _pool(4)
        router = PoolRouter(pool, MemoryRoutingStore(), random.Random(0))
        route = RouteRequest.from_doc(_doc(1), "s1")
        first = await router.pick(route, pool.replicas)
        await router.drain()
        again = await router.pick(RouteRequest.from_doc(_doc(2), "s1"), pool.replicas)
        assert again is first
        await router.drain()
        first.inflight = 20  # overloaded: over 1.25 x the mean
        order = [r for r in hash_order("h:s1", pool.replicas) if r is not first]
        spilled = await router.pick(RouteRequest.from_doc(_doc(3), "s1"), pool.replicas)
        assert spilled is order[0]
        await router.drain()
        first.inflight = 0
        follow = await router.pick(RouteRequest.from_doc(_doc(4), "s1"), pool.replicas)
        assert follow is spilled  # the bindings moved with the session
        assert router.decisions["spill"] == 1 and router.decisions["prefix"] >= 2

    asyncio.run(run())


def test_prefix_affinity_without_session_header_and_exclusion():
    async def run():
        pool = _pool(4)
        router = PoolRouter(pool, MemoryRoutingStore(), random.Random(1))
        for r, n in zip(pool.replicas, [0, 1, 2, 3], strict=True):
            r.inflight = n  # the new session goes to the least loaded
        first = await router.pick(RouteRequest.from_doc(_doc(1, "B"), None), pool.replicas)
        assert first is pool.replicas[0]
        await router.drain()
        for r in pool.replicas:
            r.inflight = 1
        nxt = RouteRequest.from_doc(_doc(2, "B"), None)
        assert await router.pick(nxt, pool.replicas) is first
        retry = await router.pick(nxt, pool.replicas, exclude=[first])
        assert retry is not None and retry is not first

    asyncio.run(run())


def test_store_down_falls_back_to_consistent_hashing():
    class Down(MemoryRoutingStore):
        degraded = True

        async def lookup(self, *a):
            return None

    async def run():
        pool_a, pool_b = _pool(5), _pool(5)  # two gateway replicas, same config
        ra = PoolRouter(pool_a, Down(), random.Random(2))
        rb = PoolRouter(pool_b, Down(), random.Random(3))
        pool_b.replicas[0].inflight = pool_b.replicas[1].inflight = 2  # local loads differ
        pool_b.replicas[2].inflight = pool_b.replicas[3].inflight = 2
        pool_b.replicas[4].inflight = 1
        for s in ("a", "b", "c", "d"):
            pa = await ra.pick(RouteRequest.from_doc(_doc(1), s), pool_a.replicas)
            pb = await rb.pick(RouteRequest.from_doc(_doc(1), s), pool_b.replicas)
            assert pa.name == pb.name == hash_order("h:" + s, pool_a.replicas)[0].name
        assert ra.decisions["hash_fallback"] == 4

    asyncio.run(run())


def test_round_robin_policy_and_exclude():
    async def run():
        pool = _pool(3, policy="round_robin")
        router = PoolRouter(pool, MemoryRoutingStore())
        route = RouteRequest.from_doc(_doc(1), None)
        got = [(await router.pick(route, pool.replicas)).name for _ in range(4)]
        assert got == [r.name for r in pool.replicas] + [pool.replicas[0].name]
        assert await router.pick(route, pool.replicas, exclude=pool.replicas) is None

    asyncio.run(run())


def test_engine_metrics_parsed_and_missing_tolerated():
    text = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 2.0\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.4\n'
    )
    values = parse_engine_metrics(text)
    assert values == {"vllm:num_requests_running": 5.0, "vllm:kv_cache_usage_perc": 0.4}
    r = _pool(1).replicas[0]
    apply_engine_metrics(r, values, now=100.0)
    assert (r.engine_running, r.engine_waiting, r.kv_cache_usage) == (5, 0, 0.4)
    r.inflight = 2
    assert replica_load(r, 101.0) == 5
    assert replica_load(r, 200.0) == 2  # stale: only this gateway's count


def test_shared_system_prompt_alone_gives_no_affinity():
    async def run():
        pool = _pool(4)
        router = PoolRouter(pool, MemoryRoutingStore(), random.Random(4))
        long_sys = {"role": "system", "content": "tools " * 2000}
        a = {"messages": [long_sys, {"role": "user", "content": "task A"}]}
        first = await router.pick(RouteRequest.from_doc(a, None), pool.replicas)
        await router.drain()
        first.inflight = 1  # busier than the others
        b = {"messages": [long_sys, {"role": "user", "content": "task B"}]}
        other = await router.pick(RouteRequest.from_doc(b, None), pool.replicas)
        assert other is not first  # a new session goes by load, not to the shared prompt
        assert router.decisions["new"] == 2

    asyncio.run(run())


def test_overloaded_is_a_queue_not_a_burst():
    rs = _pool(4).replicas
    loads = dict(zip(rs, [6, 2, 1, 0], strict=True))
    assert overloaded(rs, loads, 2.0, 16) == set()  # over 1.25 x the mean, but a burst
    loads = dict(zip(rs, [40, 2, 1, 0], strict=True))
    assert overloaded(rs, loads, 2.0, 16) == {rs[0]}  # 40 > max(16, 2 x 10.75)
    assert overloaded(rs, loads, 0, 16) == set()  # off


def test_load_scorer_counts_active_sessions_when_binding():
    rs = _pool(3).replicas
    ctx = ScoreContext(None, 0, list(rs), {rs[0]: 0, rs[1]: 2, rs[2]: 0},
                       sessions={rs[0]: 5, rs[1]: 3, rs[2]: 3})
    s = SCORERS["load"](ctx, rs)
    assert s[2] > s[1] > s[0]  # fewest sessions first; requests in flight break the tie
    assert all(0.0 <= x <= 1.0 for x in s)


def test_bound_session_stays_through_a_load_burst():
    async def run():
        pool = _pool(4)
        router = PoolRouter(pool, MemoryRoutingStore(), random.Random(5))
        first = await router.pick(RouteRequest.from_doc(_doc(1), None), pool.replicas)
        await router.drain()
        first.inflight = 6  # over ceil(1.25 x mean) = 2, but no queue worth a re-prefill
        again = await router.pick(RouteRequest.from_doc(_doc(2), None), pool.replicas)
        assert again is first and router.decisions["spill"] == 0

    asyncio.run(run())


def test_new_sessions_bound_under_the_session_bound():
    async def run():
        # no load scorer: the hash order alone would pile sessions up; the bound on active
        # sessions (Mirrokni et al.) caps every replica at ceil(1.25 x (S + 1) / n)
        pool = _pool(4, weights={"session": 1.0, "hash": 1.0})
        router = PoolRouter(pool, MemoryRoutingStore(), random.Random(6))
        picks = Counter()
        for i in range(16):
            r = await router.pick(RouteRequest.from_doc(_doc(0), f"s{i}"), pool.replicas)
            picks[r.name] += 1
            assert max(picks.values()) <= math.ceil(1.25 * (i + 1) / 4)
        assert router.ledger.counts() == dict(picks)

    asyncio.run(run())


def test_new_sessions_spread_evenly_with_the_default_weights():
    async def run():
        pool = _pool(4)
        router = PoolRouter(pool, MemoryRoutingStore(), random.Random(7))
        rng = random.Random(8)
        for i in range(12):
            for r in pool.replicas:  # requests in flight: a snapshot that keeps changing
                r.inflight = rng.randrange(3)
            await router.pick(RouteRequest.from_doc(_doc(0, f"task {i}"), None), pool.replicas)
        assert sorted(router.ledger.counts().values()) == [3, 3, 3, 3]

    asyncio.run(run())


def test_overloaded_replica_spills_to_the_longest_partial_prefix():
    async def run():
        pool = _pool(4)
        a, b = pool.replicas[0], pool.replicas[1]
        store = MemoryRoutingStore()
        router = PoolRouter(pool, store, random.Random(9))
        early = RouteRequest.from_doc(_doc(2), "s")
        await store.record(pool.key, "x", await early.chain(2048, 10**9),
                           list(range(len(early.blocks[2048]))), b.name)  # b: turn 2's prefix
        late = RouteRequest.from_doc(_doc(5), "s")
        await store.record(pool.key, "s", await late.chain(2048, 10**9),
                           list(range(len(late.blocks[2048]))), a.name)  # a: all of turn 5
        a.inflight = 30
        got = await router.pick(RouteRequest.from_doc(_doc(6), "s"), pool.replicas)
        assert got is b and router.decisions["spill"] == 1

    asyncio.run(run())


def test_session_ledger_counts_moves_and_idles():
    now = [0.0]
    led = SessionLedger(idle_s=10, max_entries=3, clock=lambda: now[0])
    led.touch("a", "r0")
    led.touch("b", "r0")
    led.touch("c", "r1")
    assert led.counts() == {"r0": 2, "r1": 1}
    assert led.counts(without="a") == {"r0": 1, "r1": 1}
    led.touch("a", "r1")  # the session moved
    assert led.counts() == {"r0": 1, "r1": 2} and led.replica_of("a") == "r1"
    led.touch("d", "r2")  # over max_entries: the least recently seen ("b") is forgotten
    assert led.replica_of("b") is None and len(led) == 3
    now[0] = 11.0
    led.touch("c", "r1")
    assert led.counts() == {"r1": 1}  # a and d idle too long


# --- sessions bound during an outage rebalance ------------------------------


def _agent_doc(task: int, turns: int) -> dict:
    """Session ``task``'s conversation after ``turns`` turns; sessions differ in size (task i
    brings i × 40 characters of tool output a turn), so which is cheapest to move is known."""
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": f"task {task}"}]
    for t in range(turns):
        msgs += [{"role": "assistant", "content": f"step {t}"},
                 {"role": "user", "content": "x" * (40 * (task + 1))}]
    return {"messages": msgs}


def test_item3_session_share_and_over_share():
    from gateway.routing.filters import over_share, session_share

    assert session_share(40, 4, 1.25) == 12  # floor(12.5); max/mean 1.2
    assert session_share(8, 4, 1.25) == 3  # ceil(2) + 1: within one of the mean never sheds
    assert over_share(40, 40, [0, 0, 0], 1.25) == 28
    assert over_share(40, 40, [], 1.25) == 0  # nobody to shed to
    assert over_share(13, 40, [13, 13, 1], 1.25) == 1
    assert over_share(12, 40, [12, 12, 4], 1.25) == 0
    assert over_share(40, 40, [0, 0, 0], 0) == 0  # bound off


def test_item3_sessions_bound_during_an_outage_rebalance_cheapest_first():
    async def run():
        pool = _pool(4)
        router = PoolRouter(pool, MemoryRoutingStore(), random.Random(11))
        a = pool.replicas[0]
        home: dict[int, str] = {}
        for s in range(40):  # only `a` is up while the 40 sessions start
            home[s] = (await router.pick(RouteRequest.from_doc(_agent_doc(s, 1), f"s{s}"),
                                         [a])).name
        await router.drain()
        assert set(home.values()) == {a.name}
        moves_per_turn = []
        for turn in range(2, 5):  # the others are back
            moved = 0
            for s in range(40):
                got = await router.pick(RouteRequest.from_doc(_agent_doc(s, turn), f"s{s}"),
                                        pool.replicas)
                moved += got.name != home[s]
                home[s] = got.name
            await router.drain()
            moves_per_turn.append(moved)
            counts = router.ledger.counts()
            assert max(counts.values()) / (40 / 4) <= 1.25, counts
        assert moves_per_turn == [28, 0, 0]  # one turn to rebalance, then it stays put
        stayed = sorted(s for s in range(40) if home[s] == a.name)
        assert stayed == list(range(28, 40))  # the longest conversations stay: cheapest moved
        assert router.decisions["rebalance"] == 28

    asyncio.run(run())


def test_item3_healthy_steady_state_never_moves_a_session():
    async def run():
        pool = _pool(4)
        router = PoolRouter(pool, MemoryRoutingStore(), random.Random(12))
        rng = random.Random(13)
        home: dict[int, str] = {}
        for turn in range(1, 7):
            order = list(range(40))
            rng.shuffle(order)
            for s in order:
                for r in pool.replicas:
                    r.inflight = rng.randrange(4)
                got = await router.pick(RouteRequest.from_doc(_agent_doc(s, turn), f"s{s}"),
                                        pool.replicas)
                assert home.setdefault(s, got.name) == got.name, (turn, s)
            await router.drain()
        assert router.decisions["rebalance"] == 0

    asyncio.run(run())


def test_item3_sessions_ending_unevenly_never_move_the_rest():
    """Churn on a healthy pool: every session on three replicas ends, the ten on the fourth go
    on. That replica now holds all the active sessions, but each was bound with every replica
    to choose from: nothing is shed (new sessions fill the empty replicas instead)."""

    async def run():
        pool = _pool(4, session_idle_s=0.3)
        router = PoolRouter(pool, MemoryRoutingStore(), random.Random(14))
        home = {s: (await router.pick(RouteRequest.from_doc(_agent_doc(s, 1), f"s{s}"),
                                      pool.replicas)).name for s in range(40)}
        await router.drain()
        stay = [s for s in range(40) if home[s] == pool.replicas[0].name]
        assert len(stay) == 10
        t_end = time.monotonic() + 0.8  # the other 30 idle out (0.3 s) meanwhile
        turn = 2
        while time.monotonic() < t_end:
            for s in stay:
                got = await router.pick(RouteRequest.from_doc(_agent_doc(s, turn), f"s{s}"),
                                        pool.replicas)
                assert got.name == home[s]
            turn += 1
            await asyncio.sleep(0.05)
        assert router.ledger.counts() == {pool.replicas[0].name: 10}
        assert router.decisions["rebalance"] == 0
        new = await router.pick(RouteRequest.from_doc(_agent_doc(99, 1), "s99"), pool.replicas)
        assert new is not pool.replicas[0]

    asyncio.run(run())


def test_in_process_bindings_are_recorded_inline_without_a_task():
    """The in-process store binds at once (``record_nowait``): the next request of the session
    finds its replica with no task left to drain; a shared store's record runs in a task."""

    async def run():
        pool = _pool(4)
        router = PoolRouter(pool, MemoryRoutingStore(), random.Random(0))
        first = await router.pick(RouteRequest.from_doc(_doc(3), "s1"), pool.replicas)
        assert not router._pending
        first.inflight = 1  # a little load elsewhere must not move the session
        again = await router.pick(RouteRequest.from_doc(_doc(4), "s1"), pool.replicas)
        assert again is first

    asyncio.run(run())
