"""Sessions that end (``gateway.admit.session_end``): ``x-speedgate-session-end: true`` on the
last turn, or idle expiry, frees the session's routing state (the session → replica binding,
the active-session ledgers, the auto tier's entry) and, on an explicit end, its budget ledger;
its usage totals stay readable and say how it ended. In memory through the whole app, and the
Redis variants of each store on the live Redis."""

from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest

from engines.sim.testing import start_sim
from gateway.app import create_app
from gateway.common.breaker import CircuitBreaker
from gateway.config import load_config
from gateway.routing.session_ledger import SessionLedger
from gateway.routing.session_ledger_redis import RedisSessionLedger
from gateway.routing.store import RedisRoutingStore

REPLICAS = ["m/standard/0", "m/standard/1"]  # names, for the Redis ledger


def _config(url: str):
    pool = {"served_model_name": "m", "endpoints": [url]}
    return load_config(health={"enabled": False}, models={"m": {
        "default_tier": "auto", "tiers": {"standard": pool, "fast": pool}}})


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _held(state, route_key: str) -> dict[str, bool]:
    """Where a session's routing state is held in this process, per kind of table."""
    pools = state.pools.all()
    return {
        "binding": any(route_key in p.router.store._sessions[p.key]._d for p in pools),
        "ledger": any(route_key in p.router.ledger._d for p in pools),
        "auto": any(route_key in t._d for t in state.auto.sessions.values()),
    }


async def _turn(c: httpx.AsyncClient, sid: str, **headers: str) -> None:
    r = await c.post("/v1/chat/completions", headers={
        "x-session-id": sid, "x-speedgate-session-budget-usd": "5", **headers}, json={
        "model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi " + sid}]})
    assert r.status_code == 200, r.text


async def test_explicit_end_and_idle_expiry_release_routing_state():
    with start_sim(time_scale=0, model="m") as sim:
        app = create_app(_config(sim.url))
        async with app.api.router.lifespan_context(app.api):
            state = app.api.state.gateway
            clock = Clock()
            state.sessions.clock = clock
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
                for sid in ("ends", "idles", "goes-on"):
                    await _turn(c, sid)
                for p in state.pools.all():
                    await p.router.drain()
                assert _held(state, "h:ends") == {"binding": True, "ledger": True, "auto": True}
                assert await state.admission.budgets.read(None, "ends") is not None

                # the last turn says so: everything it held is freed once it is done
                await _turn(c, "ends", **{"x-speedgate-session-end": "true"})
                assert _held(state, "h:ends") == {"binding": False, "ledger": False,
                                                  "auto": False}
                assert await state.admission.budgets.read(None, "ends") is None
                doc = (await c.get("/v1/usage", params={"session_id": "ends"})).json()
                assert doc["requests"] == 2 and doc["ended"] == "explicit"  # accounting stays

                # idle: "idles" went quiet past session_idle_s while "goes-on" kept talking
                clock.t += 100
                await _turn(c, "goes-on")
                clock.t += 30  # "idles" now 130 s idle (> 120), "goes-on" 30 s
                assert await state.sessions.sweep() == 1
                assert _held(state, "h:idles") == {"binding": False, "ledger": False,
                                                   "auto": False}
                assert _held(state, "h:goes-on")["binding"]
                doc = (await c.get("/v1/usage", params={"session_id": "idles"})).json()
                assert doc["ended"] == "idle" and doc["requests"] == 1
                # an idle end keeps the budget (waiting must not reset it)
                assert await state.admission.budgets.read(None, "idles") is not None
                assert state.sessions.ended == {"explicit": 1, "idle": 1}
                rows = {s.session_id: s.ended for s in state.console.sessions._by_id.values()}
                assert rows == {"ends": "explicit", "idles": "idle", "goes-on": None}
                assert len(state.sessions) == 1  # only "goes-on" is still watched


async def test_redis_routing_state_of_an_ended_session_is_deleted():
    aioredis = pytest.importorskip("redis.asyncio")
    client = aioredis.Redis.from_url("redis://127.0.0.1:6379/0", socket_timeout=1)
    prefix = f"test:session-end:{uuid.uuid4().hex[:8]}:"
    try:
        breaker = CircuitBreaker("t")
        store = RedisRoutingStore(client, breaker, prefix=prefix, timeout_s=1.0)
        ledger = RedisSessionLedger(client, breaker, SessionLedger(60.0), pool="m/standard",
                                    prefix=prefix, timeout_s=1.0)
        for s in ("h:ends", "h:stays"):
            await store.record("m/standard", s, [b"blk"], [0], REPLICAS[0])
            ledger.touch(s, REPLICAS[0], 0.0, REPLICAS)
        await ledger.drain()
        assert await ledger.counts(0.0, "", REPLICAS) == {REPLICAS[0]: 2, REPLICAS[1]: 0}

        await ledger.forget("h:ends", REPLICAS)
        await store.forget("m/standard", "h:ends")
        assert not await client.exists(store.session_key("m/standard", "h:ends"))
        assert await client.exists(store.session_key("m/standard", "h:stays"))
        assert await client.exists(store.block_key("m/standard", b"blk"))  # prefixes stay
        assert await client.zrange(ledger.key(REPLICAS[0]), 0, -1) == [b"h:stays"]
        assert "h:ends" not in ledger.local._d
        assert await ledger.counts(0.0, "", REPLICAS) == {REPLICAS[0]: 1, REPLICAS[1]: 0}
    finally:
        keys = [k async for k in client.scan_iter(match=prefix + "*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()


def test_sweep_is_ordered_and_bounded():
    """Sessions are swept oldest first and the sweep stops at the first one still live."""
    from gateway.admit.session_end import SessionEnds

    class Rec:
        def __init__(self, sid: str) -> None:
            self.session_id, self.key_id, self.session_end, self.request_id = sid, "k", False, "r"

    class Usage:
        def __init__(self) -> None:
            self.ended: list[tuple[str, str]] = []

        async def end(self, key_id, session_id, how):
            self.ended.append((session_id, how))

    class Pools:
        def all(self):
            return []

    async def main() -> None:
        clock, usage = Clock(), Usage()
        ends = SessionEnds(Pools(), None, usage, idle_s=10.0, clock=clock, max_sessions=3)
        for i, sid in enumerate(("a", "b", "c", "d")):
            clock.t = 1000.0 + i
            await ends.observe(Rec(sid), None)
        assert len(ends) == 3  # bounded: "a" forgotten (not ended: it was never swept)
        clock.t = 1012.5  # b (1001) and c (1002) idle past 10 s, d (1003) not
        assert await ends.sweep() == 2 and usage.ended == [("b", "idle"), ("c", "idle")]

    asyncio.run(main())


def test_only_an_explicit_end_touches_shared_state():
    """An idle end is seen by one gateway process (another may still serve the session): it
    releases this process's state only; an explicit end releases the shared (Redis) state and
    the budget ledger too."""
    from gateway.admit.session_end import SessionEnds

    calls: list[tuple[str, bool]] = []

    class Router:
        async def forget(self, session: str, shared: bool = True) -> None:
            calls.append((session, shared))

    class Pool:
        router = Router()

    class Pools:
        def all(self):
            return [Pool()]

    class Budgets:
        def __init__(self) -> None:
            self.released: list[str] = []

        async def release(self, key_id, session_id):
            self.released.append(session_id)

    class Usage:
        async def end(self, key_id, session_id, how):
            pass

    async def main() -> None:
        budgets = Budgets()
        ends = SessionEnds(Pools(), budgets, Usage(), idle_s=10.0)
        await ends.end("k", "a", "h:k/a", "explicit")
        await ends.end("k", "b", "h:k/b", "idle")
        assert calls == [("h:k/a", True), ("h:k/b", False)]
        assert budgets.released == ["a"]

    asyncio.run(main())


async def test_explicit_end_through_the_app_deletes_its_redis_state():
    """With ``state.redis_url`` (routing, ledgers, budgets and usage in Redis): the ended
    session's binding key, its place in the active-session sets and its budget ledger are
    deleted; its usage hash stays, marked ``ended``; another session's state is untouched."""
    aioredis = pytest.importorskip("redis.asyncio")
    client = aioredis.Redis.from_url("redis://127.0.0.1:6379/0", socket_timeout=1)
    tag = uuid.uuid4().hex[:8]
    prefix, budget_prefix = f"test:end-route:{tag}:", f"test:end-budget:{tag}:"
    ends, stays = f"ends-{tag}", f"stays-{tag}"
    try:
        await client.ping()
    except Exception:
        await client.aclose()
        pytest.skip("no Redis on 127.0.0.1:6379")
    try:
        with start_sim(time_scale=0, model="m") as sim:
            pool = {"served_model_name": "m", "endpoints": [sim.url]}
            config = load_config(
                health={"enabled": False},
                state={"redis_url": "redis://127.0.0.1:6379/0", "routing_key_prefix": prefix},
                budgets={"redis_prefix": budget_prefix},
                models={"m": {"default_tier": "standard", "tiers": {"standard": pool}}})
            app = create_app(config)
            async with app.api.router.lifespan_context(app.api):
                state = app.api.state.gateway
                (p,) = state.pools.all()
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
                    for sid in (ends, stays):
                        await _turn(c, sid)
                    await p.router.drain()
                    store, shared = p.router.store, p.router.shared_ledger
                    budget_keys = state.admission.budgets.ledger.keys(f"-/{ends}")
                    binding = store.session_key(p.key, f"h:{ends}")
                    assert await client.exists(binding)
                    assert await client.exists(budget_keys[0])
                    active = shared.key(p.replicas[0].name)
                    assert {f"h:{ends}".encode(), f"h:{stays}".encode()} <= set(
                        await client.zrange(active, 0, -1))

                    await _turn(c, ends, **{"x-speedgate-session-end": "true"})
                    assert not await client.exists(binding)
                    assert not await client.exists(*budget_keys)
                    members = set(await client.zrange(active, 0, -1))
                    assert f"h:{ends}".encode() not in members
                    assert f"h:{stays}".encode() in members
                    assert await client.exists(store.session_key(p.key, f"h:{stays}"))
                    usage = state.usage
                    assert await client.hget(usage.session_hash(None, ends), "ended") == (
                        b"explicit")
                    assert (await usage.get_session(None, ends)).requests == 2
    finally:
        keys = [k async for k in client.scan_iter(match=f"test:end-*:{tag}:*")]
        usage_keys = [k async for k in client.scan_iter(match=f"speedgate:usage:*{tag}*")]
        if keys or usage_keys:
            await client.delete(*keys, *usage_keys)
        await client.aclose()


def test_a_request_in_flight_at_an_explicit_end_does_not_bring_the_session_back():
    """A turn still running when another turn of its session ends it finishes after the end:
    its totals are counted, but the session stays ended ``explicit`` and is not swept again
    later as ``idle`` (before: its usage cleared the end, and the idle sweep ended it a second
    time, so the console said ``idle``). A turn that starts after the end resumes it."""
    from gateway.admit.session_end import SessionEnds
    from gateway.telemetry.usage_store import MemoryUsageStore, UsageDelta

    class Rec:
        def __init__(self, sid: str, t_start: float, end: bool = False) -> None:
            self.session_id, self.key_id, self.request_id = sid, "k", "r"
            self.session_end, self.t_start = end, t_start

    class Pools:
        def all(self):
            return []

    class Budgets:
        async def release(self, key_id, session_id):
            pass

    async def finished(ends: SessionEnds, usage: MemoryUsageStore, rec: Rec) -> None:
        await usage.add(rec.key_id, rec.session_id, UsageDelta(input_tokens=1))  # as accounting
        await ends.observe(rec, None)

    async def main() -> None:
        clock, usage, told = Clock(), MemoryUsageStore(), []
        ends = SessionEnds(Pools(), Budgets(), usage, idle_s=10.0, clock=clock,
                           on_end=lambda k, s, how: told.append(how))
        long_turn = Rec("s", t_start=clock.t)  # admitted, still streaming
        clock.t += 1
        await finished(ends, usage, Rec("s", t_start=clock.t, end=True))
        clock.t += 1
        await finished(ends, usage, long_turn)  # done after the end
        totals = await usage.get_session("k", "s")
        assert totals.requests == 2 and totals.ended == "explicit"
        assert told == ["explicit", "explicit"]  # the console's row is marked again
        clock.t += 60
        assert await ends.sweep() == 0 and ends.ended == {"explicit": 1, "idle": 0}
        await finished(ends, usage, Rec("s", t_start=clock.t))  # a new turn: it goes on
        assert (await usage.get_session("k", "s")).ended == ""
        assert len(ends) == 1

    asyncio.run(main())


def test_a_session_with_a_request_in_flight_is_not_idle():
    """A turn that runs longer than the idle window (a long generation) keeps its session:
    sweeps while it runs end nothing (before: the session was ended ``idle`` with its request
    still streaming, its routing state released); once it is done the idle clock starts."""
    from gateway.admit.session_end import SessionEnds
    from gateway.telemetry.usage_store import MemoryUsageStore

    class Rec:
        def __init__(self, sid: str, t_start: float) -> None:
            self.session_id, self.key_id, self.request_id = sid, "k", "r"
            self.session_end, self.t_start = False, t_start

    class Pools:
        def all(self):
            return []

    async def main() -> None:
        clock, usage = Clock(), MemoryUsageStore()
        ends = SessionEnds(Pools(), None, usage, idle_s=10.0, clock=clock)
        await ends.observe(Rec("s", clock.t), None)  # a first turn
        running = ends.begin("k", "s")  # the next one, admitted
        for _ in range(5):
            clock.t += 30
            assert await ends.sweep() == 0  # still streaming: not idle
        await ends.observe(Rec("s", clock.t), None, running)
        ends.done(running)  # given back once: a second call changes nothing
        clock.t += 5
        assert await ends.sweep() == 0
        clock.t += 10
        assert await ends.sweep() == 1 and ends.ended["idle"] == 1
        assert ends.begin("k", None) is None

    asyncio.run(main())
