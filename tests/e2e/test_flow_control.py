"""Admission for agent fleets end to end, through a real stack and the official
``openai`` client: band order, fairness across keys, flex 429, shedding with ``Retry-After``,
disconnect while queued, vLLM's ``priority`` field reaching the engine, and session budgets
across two gateway processes sharing Redis.

The standard pool has one replica and one slot (``max_inflight_per_replica: 1``), so a request
waits in the gateway queue exactly while another holds the slot. The slot is held by a
"blocker": a stream the engine paces (``sim_faults.chunk_interval_s``) that the test closes when
it chooses, so which request goes next is decided by the queue, never by timing luck. Every
request is tagged in its prompt; the engine's request log shows the order it received them.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from types import SimpleNamespace

import httpx
import openai
import pytest

from gateway.admit.auth import new_key
from tests.e2e.helpers import CHAT, metric, wait_for
from tests.e2e.stack import MODEL, Stack

pytestmark = pytest.mark.e2e

REDIS_URL = "redis://127.0.0.1:6379/0"
PREFIX = f"test:e2e-flow:{uuid.uuid4().hex}:"
POOL = f"{MODEL}/standard"
PRICES = {"input_per_mtok_usd": 1000.0, "cached_input_per_mtok_usd": 1000.0,
          "output_per_mtok_usd": 1000.0}  # 0.001 USD per token: budgets run out in a few turns


def _key(key_id: str, **entry) -> tuple[str, dict]:
    key, digest = new_key()
    return key, {"id": key_id, "hash": digest, **entry}


KEYS = {
    "flood": _key("flood"),
    "light": _key("light"),
    "batchonly": _key("batchonly", bands=["batch"], default_band="batch"),
    "agent": _key("agent", session_budget_usd=0.2, max_session_budget_usd=1.0),
    "admin": _key("admin", admin=True),
}


def api_key(name: str) -> str:
    return KEYS[name][0]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    redis = pytest.importorskip("redis")
    try:
        redis.Redis.from_url(REDIS_URL, socket_timeout=1).ping()
    except Exception:
        pytest.skip("no Redis on 127.0.0.1:6379")
    s = Stack(
        tmp_path_factory.mktemp("flow"),
        replicas_per_tier=1,
        timeouts={"connect_s": 2, "ttft_s": 300, "stall_s": 5, "total_s": 600},
        sim_args=("--time-scale", "0.02", "--scheduling-policy", "priority"),
        pool_overrides={"outlier": {"enabled": False}, "prices": PRICES},
        tier_overrides={"standard": {"max_inflight_per_replica": 1},
                        "fast": {"scheduling_policy": "priority"}},
        config_extra={
            "state": {"redis_url": REDIS_URL},
            "auth": {"keys": [entry for _, entry in KEYS.values()]},
            "budgets": {"redis_prefix": PREFIX},
            # long queue limits: the order tests' blocker makes the drain rate look slow, and
            # no request there may be shed (the shedding tests set short request timeouts)
            "flow_control": {"bands": [
                {"name": "interactive", "max_queue_s": 600},
                {"name": "standard", "max_queue_s": 600},
                {"name": "batch", "max_queue_s": 900, "max_wait_s": 300},
            ]},
        },
    )
    try:
        s.start()
        s.gateways = [s.base_url, s.add_gateway()]  # type: ignore[attr-defined]
        yield s
    finally:
        s.stop()
        client = redis.Redis.from_url(REDIS_URL)
        keys = list(client.scan_iter(match=PREFIX + "*"))
        if keys:
            client.delete(*keys)
        client.close()


def client(stack: Stack, key: str = "admin", url: str | None = None, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=(url or stack.base_url) + "/v1", api_key=api_key(key),
                         max_retries=0, **kw)


def ask(stack: Stack, tag: str, key: str = "admin", headers: dict | None = None,
        model: str = MODEL, max_tokens: int = 2, **kw):
    """One short chat turn tagged ``tag`` (what the engine log shows); the raw response."""
    return client(stack, key).chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": tag}], max_tokens=max_tokens,
        extra_headers=headers or {}, **kw)


class Blocker:
    """A stream holding the standard pool's only slot until ``close()``."""

    def __init__(self, stack: Stack) -> None:
        self._client = httpx.Client(base_url=stack.base_url, timeout=30)
        body = {"model": MODEL, "stream": True, "max_tokens": 1000, "ignore_eos": True,
                "messages": [{"role": "user", "content": "blocker"}],
                "sim_faults": {"chunk_interval_s": 0.1}}
        self._cm = self._client.stream("POST", CHAT, json=body,
                                       headers={"authorization": f"Bearer {api_key('admin')}"})
        r = self._cm.__enter__()
        assert r.status_code == 200
        self._events = r.iter_raw()  # kept: dropping the iterator would close the stream
        next(self._events)  # the first event: the slot is taken

    def close(self) -> None:
        if self._client.is_closed:
            return
        self._cm.__exit__(None, None, None)
        self._client.close()


def queued(stack: Stack) -> float:
    return metric(stack, "speedgate_queue_length", pool=POOL)


def engine_order(stack: Stack, tags: set[str]) -> list[str]:
    """The tagged requests in the order the standard engine received them."""
    out = []
    for entry in stack.sim_requests("standard"):
        body = entry.get("body") or {}
        content = (body.get("messages") or [{}])[-1].get("content")
        if content in tags:
            out.append(content)
    return out


def submit_in_order(stack: Stack, pool: ThreadPoolExecutor, calls: list[tuple]) -> list[Future]:
    """Start each call once the previous one is waiting in the queue (so arrival order is
    known), and return their futures."""
    futures = []
    for i, (fn, args, kwargs) in enumerate(calls):
        futures.append(pool.submit(fn, *args, **kwargs))
        ok = wait_for(lambda n=i + 1: queued(stack) >= n, timeout_s=10)
        assert ok, (i, queued(stack), [f.exception() for f in futures if f.done()])
    return futures


def test_bands_are_strict_and_the_answer_names_the_band(stack: Stack):
    blocker = Blocker(stack)
    with ThreadPoolExecutor(4) as pool:
        futures = submit_in_order(stack, pool, [
            (ask, (stack, "batch-1"), {"headers": {"x-speedgate-priority": "batch"}}),
            (ask, (stack, "standard-1"), {}),
            (ask, (stack, "batch-2"), {"key": "batchonly"}),  # the key's default band
            (ask, (stack, "interactive-1"), {"headers": {"x-speedgate-priority": "interactive"}}),
        ])
        blocker.close()
        answers = [f.result(timeout=30) for f in futures]
    assert engine_order(stack, {"batch-1", "standard-1", "batch-2", "interactive-1"}) == [
        "interactive-1", "standard-1", "batch-1", "batch-2"]
    assert [a.headers["x-speedgate-priority"] for a in answers] == [
        "batch", "standard", "batch", "interactive"]
    assert all(float(a.headers["x-speedgate-queue-wait-s"]) > 0 for a in answers)
    assert metric(stack, "speedgate_queue_dispatched_total", pool=POOL, band="batch") >= 2
    assert metric(stack, "speedgate_queue_wait_seconds_count", pool=POOL) >= 4


def test_a_key_may_not_name_a_band_it_lacks(stack: Stack):
    with pytest.raises(openai.PermissionDeniedError) as e:
        ask(stack, "x", key="batchonly", headers={"x-speedgate-priority": "interactive"})
    assert e.value.body["code"] == "priority_not_allowed"
    with pytest.raises(openai.BadRequestError) as e2:
        ask(stack, "x", headers={"x-speedgate-priority": "urgent"})
    assert e2.value.body["param"] == "x-speedgate-priority"


def test_fair_share_across_keys_inside_a_band(stack: Stack):
    blocker = Blocker(stack)
    calls = [(ask, (stack, f"flood-{i}"), {"key": "flood"}) for i in range(6)]
    calls += [(ask, (stack, f"light-{i}"), {"key": "light"}) for i in range(2)]
    with ThreadPoolExecutor(8) as pool:
        futures = submit_in_order(stack, pool, calls)
        blocker.close()
        for f in futures:
            f.result(timeout=30)
    order = engine_order(stack, {f"flood-{i}" for i in range(6)} | {"light-0", "light-1"})
    assert len(order) == 8
    # FIFO would serve the light key 7th and 8th; fair queuing serves it within the first 4
    assert {"light-0", "light-1"} <= set(order[:4]), order


def test_disconnect_while_queued_leaves_the_queue(stack: Stack):
    blocker = Blocker(stack)
    gone_client = client(stack, timeout=1.0)
    with pytest.raises(openai.APITimeoutError):  # the client gives up while queued
        gone_client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "gone"}], max_tokens=2)
    assert wait_for(lambda: queued(stack) == 0, timeout_s=5)
    assert wait_for(lambda: metric(stack, "speedgate_requests_total", status="499") >= 1)
    blocker.close()
    ask(stack, "after")
    assert engine_order(stack, {"gone", "after"}) == ["after"]


def test_flex_waits_then_gets_429_resource_unavailable(stack: Stack):
    blocker = Blocker(stack)
    try:
        t0 = time.monotonic()
        with pytest.raises(openai.RateLimitError) as e:
            ask(stack, "flex", service_tier="flex", headers={"x-speedgate-timeout": "1"})
        waited = time.monotonic() - t0
        err = e.value
        assert err.body["code"] == "resource_unavailable"
        assert int(err.response.headers["retry-after"]) >= 1
        assert 0.9 <= waited < 10  # it waited for its deadline in the queue, then was refused
    finally:
        blocker.close()
    ok = ask(stack, "flex-ok", service_tier="flex")
    assert ok.parse().service_tier == "flex" and ok.headers["x-speedgate-priority"] == "batch"
    assert float(ok.headers["x-speedgate-cost-usd"]) == pytest.approx(
        0.5 * sum(getattr(ok.parse().usage, f) for f in ("prompt_tokens", "completion_tokens"))
        * 1000 / 1e6)


def test_shed_at_arrival_with_retry_after_from_the_drain_rate(stack: Stack):
    # measure the drain rate: 30 short requests through the single slot
    with ThreadPoolExecutor(30) as pool:
        for f in [pool.submit(ask, stack, f"warm-{i}") for i in range(30)]:
            f.result(timeout=30)
    assert wait_for(lambda: metric(stack, "speedgate_queue_drain_tokens_per_second",
                                   pool=POOL) > 0, timeout_s=5)
    rate = metric(stack, "speedgate_queue_drain_tokens_per_second", pool=POOL)
    blocker = Blocker(stack)
    try:
        # a backlog of ~40 s at the measured rate ahead of any new standard request
        backlog = max(1000, int(rate * 40 / 8))
        big = [(ask, (stack, f"big-{i}"), {"max_tokens": backlog}) for i in range(8)]
        with ThreadPoolExecutor(8) as pool:
            futures = submit_in_order(stack, pool, big)
            t0 = time.monotonic()
            with pytest.raises(openai.InternalServerError) as e:
                ask(stack, "hurried", headers={"x-speedgate-timeout": "2"})
            answered_s = time.monotonic() - t0
            err = e.value
            assert err.status_code == 503 and err.body["code"] == "queue_wait_too_long"
            assert int(err.response.headers["retry-after"]) >= 20  # ≈ 40 s of backlog − 2 s
            assert answered_s < 1.0  # refused at once, not after 2 s in the queue
            # the gateway's own part of that answer time: arrival → decision
            assert 0 <= float(err.response.headers["x-speedgate-admit-s"]) <= answered_s
            flex = time.monotonic()
            with pytest.raises(openai.RateLimitError) as e2:
                ask(stack, "hurried-flex", service_tier="flex",
                    headers={"x-speedgate-timeout": "2"})
            assert e2.value.body["code"] == "resource_unavailable"
            assert time.monotonic() - flex < 1.0
            # the interactive band is ahead of the backlog: it waits and is served
            inter = pool.submit(ask, stack, "inter", headers={"x-speedgate-priority":
                                                              "interactive"})
            blocker.close()
            assert inter.result(timeout=30).headers["x-speedgate-priority"] == "interactive"
            for f in futures:
                f.result(timeout=120)
    finally:
        blocker.close()
    assert metric(stack, "speedgate_queue_shed_total", pool=POOL,
                  reason="expected_wait") >= 2
    assert metric(stack, "speedgate_queue_refusal_seconds_count", pool=POOL,
                  reason="expected_wait") >= 2
    assert engine_order(stack, {"hurried", "hurried-flex"}) == []


def test_band_reaches_priority_scheduling_engines_as_vllms_priority(stack: Stack):
    c = client(stack)
    c.chat.completions.create(model=f"{MODEL}-fast", max_tokens=2,
                              messages=[{"role": "user", "content": "fast-batch"}],
                              extra_headers={"x-speedgate-priority": "batch"})
    c.chat.completions.create(model=f"{MODEL}-fast", max_tokens=2, service_tier="priority",
                              messages=[{"role": "user", "content": "fast-inter"}],
                              extra_body={"priority": 99})  # the client's own value is replaced
    ask(stack, "std-batch", headers={"x-speedgate-priority": "batch"})
    sent = {(e["body"]["messages"][-1]["content"]): e["body"]
            for e in stack.sim_requests() if isinstance(e.get("body"), dict)
            and e["body"].get("messages")}
    assert sent["fast-batch"]["priority"] == 2
    assert sent["fast-inter"]["priority"] == 0
    assert "priority" not in sent["std-batch"]  # fcfs pool: the field is not sent


def test_session_budget_across_two_gateways(stack: Stack):
    gateways = stack.gateways  # type: ignore[attr-defined]
    session = f"run-{uuid.uuid4().hex[:8]}"
    headers = {"x-session-id": session}
    spent = 0.0
    served = 0
    costs = []
    reasons = []
    refused: openai.RateLimitError | None = None
    for turn in range(40):  # alternate gateways: both must see one spend
        c = client(stack, "agent", url=gateways[turn % 2])
        try:
            raw = c.chat.completions.with_raw_response.create(
                model=f"{MODEL}-auto", max_tokens=10, extra_headers=headers,
                messages=[{"role": "user", "content": f"turn {turn}"}])
        except openai.RateLimitError as e:
            refused = e
            break
        served += 1
        costs.append(float(raw.headers["x-speedgate-cost-usd"]))
        spent += costs[-1]
        assert raw.headers["x-speedgate-session-budget-usd"] == "0.200000"
        reasons.append(raw.headers.get("x-speedgate-auto-reason"))
    assert refused is not None and served >= 2, (served, spent)
    assert refused.body["code"] == "session_budget_exceeded"
    assert refused.response.headers["x-speedgate-session-budget-remaining-usd"] == "0.000000"
    assert spent >= 0.2 and spent - 0.2 < max(costs)  # overshoot: less than one turn
    assert reasons[-1] == "session-budget"  # past 80%: auto took the cheaper tier
    assert "session-budget" not in reasons[:1]
    # the other gateway agrees, and /v1/usage shows the budget
    other = gateways[served % 2]
    r = httpx.get(other + "/v1/usage", params={"session_id": session, "key_id": "agent"},
                  headers={"authorization": f"Bearer {api_key('admin')}"})
    budget = r.json()["budget"]
    assert budget["budget_usd"] == 0.2 and budget["remaining_usd"] == 0.0
    assert budget["spent_usd"] == pytest.approx(spent, rel=1e-6)
    # a larger budget per request, capped by the key's maximum
    raw = client(stack, "agent", url=other).chat.completions.with_raw_response.create(
        model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "more"}],
        extra_headers={**headers, "x-speedgate-session-budget-usd": "50"})
    assert raw.headers["x-speedgate-session-budget-usd"] == "1.000000"
    assert sum(metric(SimpleNamespace(base_url=u), "speedgate_session_budget_refusals_total",
                      model=MODEL) for u in gateways) == 1


def test_unsaturated_pool_pays_nothing(stack: Stack):
    """The fast pool has no slot cap and no engine-queue bound: no queue state at all."""
    before = metric(stack, "speedgate_queue_slots_in_use", pool=f"{MODEL}/fast")
    threads = [threading.Thread(target=ask, args=(stack, f"f{i}"),
                                kwargs={"model": f"{MODEL}-fast"}) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    text = httpx.get(stack.base_url + "/metrics").text
    assert f'speedgate_queue_length{{band="batch",pool="{MODEL}/fast"}}' not in text
    assert before == 0
