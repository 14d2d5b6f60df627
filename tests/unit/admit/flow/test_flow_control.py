"""Flow control of one process (``gateway.admit.flow.flow_control``) on a real pool registry, with
an injected clock: slots, band order, fairness, shedding, flex 429, timeouts, disconnects,
promotion and the engine-queue bound. No sleeps: the pump's step is called directly."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.admit.flow.bands import BandChoice
from gateway.admit.flow.flow_control import Admission, FlowControl, QueueRefused, Slot
from gateway.config import load_config
from gateway.fleet.pools import PoolRegistry

BANDS = [{"name": "interactive", "max_queue_s": 30}, {"name": "standard", "max_queue_s": 60},
         {"name": "batch", "max_queue_s": 900, "max_wait_s": 10}]


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def make(cap: int = 1, replicas: int = 1, bands: list[dict] | None = None,
         flow_extra: dict | None = None, **pool: Any) -> tuple[FlowControl, Any, Clock]:
    cfg = load_config(
        flow_control={"bands": bands or BANDS, "recheck_interval_s": 1000,
                      **(flow_extra or {})},
        models={"m": {"tiers": {"standard": {
            "served_model_name": "m", "max_inflight_per_replica": cap,
            "endpoints": [f"http://10.0.0.{i}:8000" for i in range(replicas)], **pool}}}},
    )
    pools = PoolRegistry(cfg)
    clock = Clock()
    return FlowControl(cfg, pools, clock=clock), pools.get("m", "standard"), clock


def adm(band: int, key: str = "k", session: str = "s", cost: float = 100,
        flex: bool = False, weight: float = 1.0) -> Admission:
    names = ["interactive", "standard", "batch"]
    return Admission(BandChoice(band, names[band], flex, "test"), key, session, weight, cost)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def queue(flow: FlowControl, pool: Any, a: Admission, budget_s: float = 50) -> asyncio.Task:
    t = asyncio.get_running_loop().create_task(flow.acquire(pool, a, budget_s))
    await settle()
    return t


async def test_a_pool_without_a_bound_pays_nothing():
    flow, pool, _ = make(cap=0)
    assert await flow.acquire(pool, adm(2), 10) is None
    assert flow.pools[pool.key].task is None and len(flow.pools[pool.key].queue) == 0


async def test_strict_band_order_when_slots_free():
    flow, pool, _ = make(cap=1)
    first = await flow.acquire(pool, adm(1), 10)
    assert isinstance(first, Slot) and not first.queued
    batch = await queue(flow, pool, adm(2, key="b"))
    std = await queue(flow, pool, adm(1, key="s"))
    inter = await queue(flow, pool, adm(0, key="i"))
    assert not (batch.done() or std.done() or inter.done())
    order = []
    slot = first
    for _ in range(3):
        flow.release(slot, None)
        await settle()
        done = [t for t in (batch, std, inter) if t.done() and t not in order]
        assert len(done) == 1
        order.append(done[0])
        slot = done[0].result()
    assert order == [inter, std, batch]
    assert slot.queued and slot.band == 2


async def test_fair_share_across_keys_through_the_queue():
    flow, pool, _ = make(cap=1)
    held = await flow.acquire(pool, adm(2), 10)
    tasks = [await queue(flow, pool, adm(2, key="flood", session=f"s{i}")) for i in range(8)]
    tasks += [await queue(flow, pool, adm(2, key="light", session=f"l{i}")) for i in range(2)]
    served: list[str] = []
    slot = held
    while True:
        flow.release(slot, None)
        await settle()
        done = [t for t in tasks if t.done()]
        if not done:
            break
        t = done[0]
        tasks.remove(t)
        slot = t.result()
        served.append(slot.admission.key)
    # the light key's two requests go within the first four, not after the flood's eight
    assert served[:4].count("light") == 2 and len(served) == 10


async def test_reserved_share_keeps_slots_for_the_top_band():
    bands = [{**BANDS[0], "reserved_share": 0.2}, BANDS[1], BANDS[2]]
    flow, pool, _ = make(cap=5, replicas=2, bands=bands)  # 10 slots, 2 held for interactive
    slots = [await flow.acquire(pool, adm(1, session=str(i)), 10) for i in range(8)]
    assert all(s is not None and not s.queued for s in slots)
    waiting = await queue(flow, pool, adm(2))
    assert not waiting.done()
    top = await flow.acquire(pool, adm(0), 10)  # straight through: a reserved slot
    assert top is not None and not top.queued
    flow.release(top, None)
    await settle()
    assert not waiting.done()  # the freed slot is a reserved one
    flow.release(slots[0], None)
    await settle()
    assert waiting.done()


async def test_a_tiny_pool_reserves_no_slot_for_a_share_under_half_a_slot():
    """Regression: 10% of 2 slots rounded up to 1 reserved slot, so on 2 replicas × 1 slot two
    standard requests ran one after the other while a replica sat idle."""
    bands = [{**BANDS[0], "reserved_share": 0.1}, BANDS[1], BANDS[2]]
    flow, pool, _ = make(cap=1, replicas=2, bands=bands)
    a = await flow.acquire(pool, adm(1, session="a"), 10)
    b = await flow.acquire(pool, adm(1, session="b"), 10)
    assert a is not None and b is not None and not a.queued and not b.queued
    for s in (a, b):
        flow.release(s, None)
    await flow.close()


async def test_a_reservation_in_use_lets_the_lower_bands_fill_the_rest():
    """A top-band request running in a reserved slot uses the reservation: the lower bands
    may take every other slot, and only the reservation's unused part stays idle."""
    bands = [{**BANDS[0], "reserved_share": 0.2}, BANDS[1], BANDS[2]]
    flow, pool, _ = make(cap=5, replicas=2, bands=bands)  # 10 slots, 2 reserved
    slots = [await flow.acquire(pool, adm(1, session=str(i)), 10) for i in range(8)]
    top = await flow.acquire(pool, adm(0), 10)
    assert top is not None and not top.queued
    pf = flow.pools[pool.key]
    assert pf.active == 9 and pf.held == [1, 8, 0]
    first = await queue(flow, pool, adm(2, key="c"))
    assert not first.done()  # the 10th slot is the reservation's unused part
    flow.release(slots[0], None)
    await settle()
    # 8 in use: the top band holds one of its 2 reserved slots, so 9 may be in use
    assert first.done() and pf.held == [1, 7, 1]
    flow.release(top, None)
    second = await queue(flow, pool, adm(2, key="d"))
    assert not second.done()  # both reserved slots unused again: 8 may be in use
    flow.release(slots[1], None)
    await settle()
    assert second.done() and pf.held == [0, 6, 2]


async def _measured(flow: FlowControl, pool: Any, clock: Clock) -> Slot:
    """Backlog the pool and drain it at 1,000 tokens/s (100-token requests, one per 0.1 s)."""
    slot = await flow.acquire(pool, adm(1), 10)
    tasks = [await queue(flow, pool, adm(1, session=str(i))) for i in range(10)]
    for t in tasks:
        clock.t += 0.1
        flow.release(slot, None)
        await settle()
        slot = t.result()
    return slot


async def test_shed_at_once_with_retry_after_from_the_drain_rate():
    flow, pool, clock = make(cap=1)
    held = await _measured(flow, pool, clock)
    assert flow.pools[pool.key].drain.rate() == pytest.approx(1000, rel=0.05)
    for i in range(20):  # 2,000 tokens ahead: ~2 s of waiting
        await queue(flow, pool, adm(1, key="x", session=str(i)))
    with pytest.raises(QueueRefused) as e:
        await flow.acquire(pool, adm(1, key="x"), budget_s=0.5)
    err = e.value
    assert err.status == 503 and err.code == "queue_wait_too_long" and err.reason == "expected_wait"
    assert 1.0 <= err.retry_after_s <= 2.0  # ≈ expected wait (~2.1 s) − budget (0.5 s)
    assert flow.shed[(pool.key, "standard", "expected_wait")] == 1
    # flex: OpenAI's answer when there is no capacity
    with pytest.raises(QueueRefused) as e2:
        await flow.acquire(pool, adm(2, key="x", flex=True), budget_s=0.5)
    assert (e2.value.status, e2.value.code) == (429, "resource_unavailable")
    assert e2.value.headers()["retry-after"]
    # a request that fits its budget waits
    fits = await queue(flow, pool, adm(0, key="y"), budget_s=5)
    assert not fits.done()
    flow.release(held, None)
    await settle()
    assert fits.done() and fits.result().band == 0


async def test_timeout_while_queued_is_refused_then():
    flow, pool, clock = make(cap=1)
    await flow.acquire(pool, adm(1), 10)
    waiting = await queue(flow, pool, adm(1, key="w"), budget_s=5)
    clock.t += 4.9
    flow.pools[pool.key].tick(clock())
    assert not waiting.done()
    clock.t += 0.1
    flow.pools[pool.key].tick(clock())
    await settle()
    with pytest.raises(QueueRefused) as e:
        waiting.result()
    assert e.value.code == "queue_timeout" and e.value.headers()["retry-after"] == "1"
    assert len(flow.pools[pool.key].queue) == 0


async def test_client_gone_while_queued_leaves_the_queue():
    flow, pool, _ = make(cap=1)
    held = await flow.acquire(pool, adm(1), 10)
    gone = await queue(flow, pool, adm(1, key="gone"))
    after = await queue(flow, pool, adm(1, key="after"))
    gone.cancel()
    await settle()
    pf = flow.pools[pool.key]
    assert len(pf.queue) == 1
    flow.release(held, None)
    await settle()
    assert after.done() and pf.active == 1


async def test_dispatched_as_the_client_left_gives_the_slot_back():
    flow, pool, _ = make(cap=1)
    held = await flow.acquire(pool, adm(1), 10)
    t = await queue(flow, pool, adm(1, key="late"))
    flow.release(held, None)  # dispatches to t (its future is done, its task not yet run)
    t.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t
    assert flow.pools[pool.key].active == 0


async def test_starvation_guard_promotes_a_waiting_batch_request():
    flow, pool, clock = make(cap=1)
    held = await flow.acquire(pool, adm(1), 10)
    batch = await queue(flow, pool, adm(2, key="b"))
    clock.t += 5
    std = await queue(flow, pool, adm(1, key="s"))
    clock.t += 5  # the batch request has waited 10 s = its band's max_wait_s
    flow.pools[pool.key].tick(clock())
    assert flow.promotions[(pool.key, "batch", "standard")] == 1
    flow.release(held, None)
    await settle()
    assert batch.done() and not std.done()
    assert batch.result().band == 1 and batch.result().waited_s == pytest.approx(10)


async def test_engine_queue_bound_saturates_a_pool_without_a_slot_cap():
    flow, pool, clock = make(cap=0, max_engine_waiting=2)
    r = pool.replicas[0]
    r.engine_waiting, r.engine_load_at = 5, clock()
    waiting = await queue(flow, pool, adm(1))
    assert not waiting.done()
    r.engine_waiting, r.engine_load_at = 0, clock() + 0.5  # the next scrape: the queue drained
    clock.t += 0.5
    flow.pools[pool.key].tick(clock())
    await settle()
    assert waiting.done()
    # between scrapes, requests sent count as waiting: two more fit under the bound of 2
    slots = [await flow.acquire(pool, adm(1, session=str(i)), 10) for i in range(2)]
    assert all(s is not None and not s.queued for s in slots)
    assert not (await queue(flow, pool, adm(1, key="z"))).done()


async def test_unhealthy_replicas_take_their_slots_away():
    flow, pool, _ = make(cap=1, replicas=2)
    pool.replicas[1].healthy = False
    await flow.acquire(pool, adm(1), 10)
    t = await queue(flow, pool, adm(1, key="second"))
    assert not t.done()
    pool.replicas[1].healthy = True
    flow.pools[pool.key].tick(flow.clock())
    await settle()
    assert t.done()


async def test_close_refuses_what_still_waits():
    flow, pool, _ = make(cap=1)
    await flow.acquire(pool, adm(1), 10)
    t = await queue(flow, pool, adm(1, key="w"))
    await flow.close()
    await settle()
    assert isinstance(t.exception(), QueueRefused)


async def test_a_backlogged_key_waits_at_its_own_share_of_the_drain():
    """Two keys share the slot half and half: the pool drains 1,000 tokens/s but each key only
    500, so a new request of a backlogged key waits for its own queue at 500 tokens/s; a key
    with nothing waiting starts after its fair share of the others'."""
    flow, pool, clock = make(cap=1)
    slot = await flow.acquire(pool, adm(1), 10)
    tasks = [await queue(flow, pool, adm(1, key=k, session=f"{k}{i}"))
             for i in range(8) for k in ("a", "b")]
    for _ in range(10):  # 5 of each dispatched, one per 0.1 s
        clock.t += 0.1
        flow.release(slot, None)
        await settle()
        done = next(t for t in tasks if t.done())
        tasks.remove(done)
        slot = done.result()
    pf = flow.pools[pool.key]
    wait_a = pf.wait_s(1, adm(1, key="a"))  # its 3 queued at 500/s
    wait_new = pf.wait_s(1, adm(1, key="new"))  # an equal share (its cost) of a's and b's
    assert wait_a == pytest.approx(0.6, rel=0.05)
    assert wait_new == pytest.approx(0.2, rel=0.05)
    assert pf.drain.rate() == pytest.approx(1000, rel=0.05)
    assert pf.key_drain["a"].rate() == pytest.approx(500, rel=0.05)
    with pytest.raises(QueueRefused):
        await flow.acquire(pool, adm(1, key="a"), budget_s=0.5)
    fits = await queue(flow, pool, adm(1, key="new"), budget_s=0.5)
    assert not fits.done()


async def test_service_time_per_band_is_learned():
    flow, pool, clock = make(cap=2)
    s = await flow.acquire(pool, adm(2), 10)
    clock.t += 8.0
    flow.release(s, None)
    assert flow.service_s(pool, 2) == pytest.approx(8.0)
    assert flow.service_s(pool, 0) == 0.0
    s = await flow.acquire(pool, adm(2), 10)
    clock.t += 18.0
    flow.release(s, None)
    assert flow.service_s(pool, 2) == pytest.approx(10.0)  # EWMA, 0.2 to the newest


async def test_a_refusal_reports_its_decision_time_from_arrival():
    """``AdmissionControl.wait`` stamps a refusal with the seconds since the request reached
    the gateway (``rec.t_start``): the ``x-speedgate-admit-s`` header and the refusal metric."""
    from types import SimpleNamespace

    from gateway.admit.admission import AdmissionControl, Ticket
    from gateway.admit.budget import SessionBudgets
    from gateway.telemetry.record import RequestRecord

    flow, pool, clock = make(cap=1)
    held = await _measured(flow, pool, clock)
    for i in range(20):
        await queue(flow, pool, adm(1, key="x", session=str(i)))
    seen: list[tuple[str, str, str, float]] = []
    flow.refusal_observer = lambda *a: seen.append(a)
    control = AdmissionControl(flow, SessionBudgets(flow.config, None))
    rec = RequestRecord(request_id="r", path="/v1/chat/completions")
    rec.t_start -= 0.25  # it reached the gateway a quarter second ago
    plan = SimpleNamespace(chain=[pool])
    with pytest.raises(QueueRefused) as e:
        await control.wait(Ticket(adm(1, key="x")), plan, 0.5, rec)  # type: ignore[arg-type]
    err = e.value
    assert err.decision_s is not None and err.decision_s >= 0.25
    assert float(err.headers()["x-speedgate-admit-s"]) == pytest.approx(err.decision_s, abs=1e-4)
    assert err.headers()["retry-after"]
    assert seen == [(pool.key, "standard", "expected_wait", err.decision_s)]
    flow.release(held, None)
    await flow.close()


async def test_first_token_guard_holds_the_last_free_slot_while_a_top_band_first_token_is_due():
    """After a top-band request takes a slot, lower bands may not take the last free slot for
    its band's typical time to first token (learned from finished top-band requests, capped by
    ``first_token_guard_s``): their prefill would share the full step its first token needs."""
    flow, pool, clock = make(cap=2, flow_extra={"first_token_guard_s": 0.5})
    pf = flow.pools[pool.key]
    first = await flow.acquire(pool, adm(0), 10)
    assert pf.guard.until == 0.0  # nothing learned yet: no guard
    flow.release(first, 50, ttft_s=0.2)
    assert pf.guard.ttft_s == pytest.approx(0.2)
    top = await flow.acquire(pool, adm(0), 10)
    assert pf.guard.until == pytest.approx(clock.t + 0.2)
    batch = await queue(flow, pool, adm(2, key="b"))  # one slot free: the guard holds it
    assert not batch.done() and pf.lowest_band(clock.t) == 0
    clock.t += 0.2
    pf.tick(clock.t)
    await settle()
    assert batch.done() and batch.result().queued
    flow.release(batch.result(), None)
    # a slow first token is capped by first_token_guard_s
    for _ in range(30):
        flow.release(await flow.acquire(pool, adm(0), 10), 50, ttft_s=3.0)
    assert pf.guard.until == pytest.approx(clock.t + 0.5)
    flow.release(top, None)
    await flow.close()


async def test_first_token_guard_costs_an_unsaturated_pool_nothing():
    """Regression: every top-band dispatch renewed the guard, so with top-band requests
    arriving faster than their TTFT a standard request never started while 6 of 8 slots
    sat idle. While another slot stays free after it, a lower band goes at once."""
    flow, pool, clock = make(cap=8, flow_extra={"first_token_guard_s": 0.5})
    pf = flow.pools[pool.key]
    flow.release(await flow.acquire(pool, adm(0), 10), 50, ttft_s=0.6)
    tops = [await flow.acquire(pool, adm(0), 10) for _ in range(2)]
    assert pf.guard.until > clock.t
    std = await flow.acquire(pool, adm(1, key="s"), 10)
    assert std is not None and not std.queued
    for s in (*tops, std):
        flow.release(s, None)
    await flow.close()


async def test_first_token_guard_holds_a_lower_band_request_at_most_its_cap():
    """Renewals by new top-band dispatches never hold one lower-band request longer than
    ``first_token_guard_s`` in all."""
    flow, pool, clock = make(cap=2, flow_extra={"first_token_guard_s": 0.5})
    pf = flow.pools[pool.key]
    flow.release(await flow.acquire(pool, adm(0), 10), 50, ttft_s=0.375)
    top = await flow.acquire(pool, adm(0), 10)
    batch = await queue(flow, pool, adm(2, key="b"))
    for step in (0.25, 0.125):  # a new top-band request renews the guard before it ends
        clock.t += step
        newer = await flow.acquire(pool, adm(0), 10)
        flow.release(top, 50, ttft_s=0.375)
        top = newer
        pf.tick(clock.t)
        await settle()
        assert not batch.done() and pf.guard.until > clock.t
    clock.t += 0.125  # 0.5 s since the batch request arrived: the guard lets it go
    pf.tick(clock.t)
    await settle()
    assert batch.done() and batch.result().waited_s == pytest.approx(0.5)
    flow.release(top, None)
    flow.release(batch.result(), None)
    await flow.close()


async def test_first_token_guard_off_and_lower_band_ttfts_teach_nothing():
    flow, pool, _ = make(cap=4, flow_extra={"first_token_guard_s": 0})
    pf = flow.pools[pool.key]
    flow.release(await flow.acquire(pool, adm(0), 10), 50, ttft_s=0.2)
    await flow.acquire(pool, adm(0), 10)
    assert pf.guard.until == 0.0
    assert await flow.acquire(pool, adm(2), 10) is not None
    flow2, pool2, _ = make(cap=4)
    flow2.release(await flow2.acquire(pool2, adm(2), 10), 50, ttft_s=0.2)
    assert flow2.pools[pool2.key].guard.ttft_s is None
    await flow.close()
    await flow2.close()


def test_an_echo_only_request_costs_its_prompt_alone():
    """``max_tokens: 0`` (echo without generation) generates nothing: no output estimate."""
    flow, _, _ = make(cap=1)
    assert flow.classify(None, None, {"max_tokens": 0, "echo": True}, 400, None).cost == 100
    default = flow.config.flow_control.default_output_tokens
    assert flow.classify(None, None, {}, 400, None).cost == 100 + default
