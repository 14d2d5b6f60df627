"""The Responses and Messages front doors against client mistakes (fuzzing's findings): bodies
the gateway can see are malformed are refused 400 in the API's shape before any replica (so
none is ejected), ``service_tier`` of the wrong type, response ids that cannot name a
response (never a lookup, never a cancel marker), and clients that leave at once with Redis
configured (the engine request aborted, 499, nothing billed)."""

from __future__ import annotations

import asyncio
import re
import socket
import uuid
from collections.abc import Iterator

import anthropic
import httpx
import openai
import orjson
import pytest
import redis

from tests.e2e.helpers import wait_for
from tests.e2e.protocol_helpers import MESSAGES, PROTOS, RESPONSES, Proto
from tests.e2e.stack import MODEL, Stack

pytestmark = pytest.mark.e2e

REDIS_URL = "redis://127.0.0.1:6379/0"
POOL = {"outlier": {"consecutive_failures": 2, "base_ejection_s": 30},
        "retry": {"budget_percent": 100, "budget_min_retries": 50}}
SCHEMA_BAD = [{"type": "object", "properties": {"x": {"enum": 5}}}, {"items": [1]},
              {"type": 7}, {"properties": {"x": {"type": "array", "items": [1]}}}]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, str]]:
    prefix = f"test:frontdoors:{uuid.uuid4().hex[:8]}:"
    try:
        redis.Redis.from_url(REDIS_URL, socket_timeout=1).ping()
    except Exception:
        pytest.skip("no Redis on 127.0.0.1:6379")
    stack = Stack(
        tmp_path_factory.mktemp("front-doors"), pool_overrides=POOL,
        config_extra={"state": {"redis_url": REDIS_URL, "routing_key_prefix": prefix + "route:"},
                      "responses": {"redis_prefix": prefix + "resp:"}},
    )
    try:
        stack.start()
        yield stack, prefix
    finally:
        stack.stop()
        r = redis.Redis.from_url(REDIS_URL)
        keys = list(r.scan_iter(match=prefix + "*", count=1000))
        if keys:
            r.delete(*keys)
        r.close()


def _no_ejection(stack: Stack) -> bool:
    tiers = httpx.get(stack.base_url + "/readyz").json()["models"][MODEL]
    return all(t["usable"] == t["replicas"] for t in tiers.values())


def _messages_mistakes() -> list[dict]:
    base = MESSAGES.body()
    user = base["messages"]
    out = [
        {**base, "messages": [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": 5}]}]},
        {**base, "tool_choice": {"type": {}}},
        {**base, "tools": 1.5},
        {**base, "tools": [{"name": 5, "input_schema": {"type": "object"}}]},
        {**base, "system": [{"type": "text", "text": 3}]},
        {**base, "stop_sequences": "stop"},
        {**base, "messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                           {"type": "image", "source": 1}]}]},
        {**base, "messages": [*user, {"role": "assistant", "content": [
            {"type": "tool_use", "id": "t", "name": "f", "input": "not an object"}]}]},
    ]
    out += [{**base, "tools": [{"name": "f", "input_schema": s}]} for s in SCHEMA_BAD]
    return out


def _responses_mistakes() -> list[dict]:
    base = RESPONSES.body()
    out = [
        {**base, "tools": 1.5},
        {**base, "tool_choice": {"type": {}}},
        {**base, "tool_choice": "sometimes"},
        {**base, "input": [{"type": "function_call_output", "call_id": 5, "output": "x"}]},
        {**base, "input": [{"role": "user", "content": [{"type": "input_text", "text": 1}]}]},
        {**base, "instructions": 5},
        {**base, "metadata": {"a": 1}},
        {**base, "text": {"format": "json"}},
    ]
    out += [{**base, "tools": [{"type": "function", "name": "f", "parameters": s}]}
            for s in SCHEMA_BAD]
    return out


def test_malformed_bodies_are_400_before_any_replica_and_eject_none(env):
    stack, _ = env
    stack.reset_sims()
    oa = openai.OpenAI(base_url=stack.base_url + "/v1", api_key="x", max_retries=0)
    an = anthropic.Anthropic(base_url=stack.base_url, api_key="x", max_retries=0)
    for _ in range(3):  # thrice: more than enough to eject every replica if they counted
        for body in _responses_mistakes():
            with pytest.raises(openai.BadRequestError) as e:
                oa.responses.create(**body)
            assert e.value.body["type"] == "invalid_request_error", e.value.body
        for body in _messages_mistakes():
            with pytest.raises(anthropic.BadRequestError) as ea:
                an.messages.create(**body)
            assert ea.value.body["type"] == "error"
            assert ea.value.body["error"]["type"] == "invalid_request_error"
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        for extra in ({"tool_choice": {"type": {}}}, {"tools": [{"type": "function",
                      "function": {"name": "f", "parameters": {"enum": 5}}}]},
                      {"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]}):
            with pytest.raises(openai.BadRequestError):
                oa.chat.completions.create(**{**chat, **extra})
    assert stack.sim_requests() == []  # refused before any replica
    assert _no_ejection(stack)


@pytest.mark.parametrize("tier", [{}, [], [None], 5])
def test_messages_service_tier_of_the_wrong_type_is_400(env, tier):
    stack, _ = env
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        r = httpx.post(stack.base_url + path, json=MESSAGES.body(service_tier=tier))
        assert r.status_code == 400, r.text
        assert r.json()["error"]["type"] == "invalid_request_error"


def _raw_request(stack: Stack, method: str, path: str) -> tuple[int, dict[str, str], bytes]:
    """One request on a raw socket (httpx refuses URLs over 64 KiB): status, headers, body."""
    host, port = stack.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\n"
                  "Connection: close\r\n\r\n".encode())
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(ln.lower().split(": ", 1) for ln in lines[1:] if ": " in ln)
    return int(lines[0].split()[1]), headers, body


def test_ids_that_name_nothing_get_the_json_404_and_never_see_markers(env):
    """While a response runs (its marker in Redis), ids built on its marker key, junk ids and
    a 100 KB id get the same JSON 404 as a missing one, on every state route."""
    stack, prefix = env
    r = redis.Redis.from_url(REDIS_URL)
    running = "resp_" + uuid.uuid4().hex
    r.set(prefix + "resp:run:" + running, "", px=60_000)  # as a running response's marker
    missing = "resp_" + uuid.uuid4().hex
    ids = [f"run:{running}", f"rec:{missing}", "x" * 100_000, "resp_" + "a" * 129,
           "resp_a.b", "resp_a%20b", missing]
    with httpx.Client(base_url=stack.base_url, timeout=10) as c:
        for rid in ids:
            for method, path in (("GET", f"/v1/responses/{rid}"),
                                 ("DELETE", f"/v1/responses/{rid}"),
                                 ("POST", f"/v1/responses/{rid}/cancel")):
                status, headers, body = _raw_request(stack, method, path)
                assert status == 404, (method, rid[:40], body[:200])
                assert headers["content-type"] == "application/json"
                assert orjson.loads(body)["error"]["code"] == "response_not_found", rid[:40]
        for rid in [*ids, "resp_a/b", "../x", "resp_\u00e9", running]:
            resp = c.post("/v1/responses", json=RESPONSES.body(previous_response_id=rid))
            assert resp.status_code == 404, (rid[:40], resp.text[:200])
            assert resp.json()["error"]["code"] == "response_not_found"
    r.close()


def _leave_at_once(stack: Stack, proto: Proto, stream: bool, rid: str, rst: bool) -> None:
    """Send a whole request on a raw socket and close it at once (FIN, or RST)."""
    body = orjson.dumps(proto.body(f"leave {rid}", stream=stream,
                                   sim_faults={"chunks": ["x"] * 30, "chunk_interval_s": 0.1}))
    host, port = stack.base_url.removeprefix("http://").split(":")
    head = (f"POST {proto.path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nx-request-id: {rid}\r\n\r\n").encode()
    s = socket.create_connection((host, int(port)))
    if rst:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    s.sendall(head + body)
    s.close()


@pytest.mark.parametrize("proto", PROTOS, ids=[p.name for p in PROTOS])
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
def test_a_client_that_leaves_at_once_is_aborted_with_redis(env, proto: Proto, stream: bool):
    stack, _ = env
    stack.reset_sims()
    rids = [f"leave-{proto.name}-{stream}-{i}-{uuid.uuid4().hex[:6]}" for i in range(6)]
    for i, rid in enumerate(rids):
        _leave_at_once(stack, proto, stream, rid, rst=bool(i % 2))

    def logged() -> dict[str, str]:
        out = {}
        for line in stack.log().splitlines():
            m = re.search(r"request_id=(\S+) .* status=(\d+) outcome=(\S+)", line)
            if m and m.group(1) in rids:
                out[m.group(1)] = f"{m.group(2)} {m.group(3)}"
        return out

    assert wait_for(lambda: len(logged()) == len(rids), timeout_s=15), logged()
    assert set(logged().values()) == {"499 client_disconnected"}, logged()
    stats = stack.sim_stats()
    assert stats["completed"] == 0, stats  # every one that reached an engine was aborted
    assert wait_for(lambda: stack.sim_stats()["aborted"] == stats["requests"], timeout_s=5)
    # nothing billed: no usage, no cost on any of their access log lines
    lines = [ln for ln in stack.log().splitlines() if any(f"request_id={r} " in ln for r in rids)]
    assert lines and all("cost_usd=None" in ln for ln in lines), lines


def test_a_short_fuzz_gets_no_5xx_no_hang_no_leak_no_ejection(env, tmp_path_factory):
    """A bounded run of ``loadtests/fuzz_front_doors.py`` (every category, Redis configured)
    against simulators that refuse ``sim_faults`` as a production replica does."""
    from loadtests.fuzz_front_doors import fuzz

    stack = Stack(tmp_path_factory.mktemp("fuzz"), pool_overrides=POOL,
                  accept_sim_faults=False, config_extra=env[0].config_extra)
    try:
        stack.start()
        assert stack.gateway is not None
        rep = asyncio.run(fuzz(stack.base_url, count=200, time_s=90, seed=3,
                               pid=stack.gateway.pid, log=stack.log_path))
    finally:
        stack.stop()
    summary = rep.summary()
    assert rep.requests >= 150 and rep.by_category["leave"] > 0, summary
    assert rep.five_xx == 0 and rep.hangs == 0 and not rep.leaks, summary
    assert rep.ejections == 0 and not rep.not_aborted, summary
    assert not any(k.endswith("not-json") for k in rep.status), summary
