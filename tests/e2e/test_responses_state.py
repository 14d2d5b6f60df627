"""Responses state across gateway replicas: a ``previous_response_id`` chain of 5
turns alternating between two gateway processes that share Redis, with the replica serving it
restarted in the middle. vLLM would lose its own stored responses at the restart and never see
the other replica's; here the gateway owns the state, so every turn expands, and the chain's
session key keeps every turn on the replica holding its KV prefix. And a cancel that reaches
the other gateway process is passed, through Redis, to the one running the response."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import httpx
import openai
import pytest
import redis

from tests.e2e.helpers import wait_for
from tests.e2e.protocol_helpers import RESPONSES, parse_events
from tests.e2e.stack import MODEL, Stack

pytestmark = pytest.mark.e2e

REDIS_URL = "redis://127.0.0.1:6379/0"
TOOLS = [{"type": "function", "name": "run_tests", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}},
    "required": ["path"]}}]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, str, str]]:
    prefix = f"test:responses:{uuid.uuid4().hex[:8]}:"
    try:
        redis.Redis.from_url(REDIS_URL, socket_timeout=1).ping()
    except Exception:
        pytest.skip("no Redis on 127.0.0.1:6379")
    stack = Stack(
        tmp_path_factory.mktemp("resp-state"),
        replicas_per_tier=2,
        health={"interval_s": 0.2, "timeout_s": 0.5},
        config_extra={"state": {"redis_url": REDIS_URL, "routing_key_prefix": prefix + "route:"},
                      "responses": {"redis_prefix": prefix + "resp:"}},
    )
    try:
        stack.start()
        yield stack, stack.add_gateway(), prefix
    finally:
        stack.stop()
        r = redis.Redis.from_url(REDIS_URL)
        keys = list(r.scan_iter(match=prefix + "*", count=1000))
        if keys:
            r.delete(*keys)
        r.close()


def _usable(*gateways: str) -> bool:
    """Every replica usable as each of ``gateways`` sees it (each gateway probes health on its
    own: one may still hold the restarted replica ejected when the other already uses it)."""
    for url in gateways:
        tiers = httpx.get(url + "/readyz").json()["models"][MODEL]
        if not all(t["usable"] == t["replicas"] for t in tiers.values()):
            return False
    return True


def test_previous_response_id_chain_across_gateways_and_a_replica_restart(env):
    stack, second, prefix = env
    clients = [openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
               for url in (stack.base_url, second)]
    task = f"fix the failing test in module {uuid.uuid4().hex}"
    previous, replicas, input_lengths, call_id = None, [], [], "none"
    for turn in range(5):
        if turn == 2:  # restart the replica that served the chain so far, same address
            url = stack.sims["standard"][int(replicas[-1].rsplit("/", 1)[1])]
            stack.kill_sim(url, crash=True)
            stack.restart_sim(url)
            assert wait_for(lambda: _usable(stack.base_url, second), timeout_s=10)
        if turn == 0:
            item = {"role": "user", "content": task + " " + "context " * 300}
        elif turn % 2:
            item = {"type": "function_call_output", "call_id": call_id, "output": "1 failed"}
        else:
            item = {"role": "user", "content": f"turn {turn}: try again"}
        extra = {"previous_response_id": previous} if previous else {}
        raw = clients[turn % 2].responses.with_raw_response.create(
            model=MODEL, input=[item], tools=TOOLS, max_output_tokens=32, **extra)
        r = raw.parse()
        assert r.previous_response_id == previous
        replicas.append(raw.headers["x-speedgate-replica"])
        sent = [e["body"] for e in stack.sim_requests()
                if isinstance(e["body"], dict) and e["body"].get("request_id") == r.id]
        input_lengths.append(len(sent[0]["input"]))
        call_id = next((o.call_id for o in r.output if o.type == "function_call"), "none")
        previous = r.id
    # each turn reached the engine as the whole conversation: earlier inputs and outputs
    assert input_lengths == [1, 3, 5, 7, 9]
    # turn N+1 reached turn N's replica, from either gateway, across the restart
    assert len(set(replicas)) == 1, replicas
    # both gateways read the same stored responses (Redis), under the configured prefix
    for c in clients:
        assert c.responses.retrieve(previous).id == previous
    keys = redis.Redis.from_url(REDIS_URL).keys(prefix + "resp:rec:*")
    assert len(keys) == 5


def test_cancel_reaches_the_gateway_running_the_response(env):
    """A stream runs on the first gateway; its cancel arrives at the second, which passes it
    on through Redis: the stream ends with the cancel error and the engine aborts."""
    stack, second, _ = env
    stack.reset_sims()
    body = RESPONSES.body(stream=True, sim_faults={"chunks": ["x"] * 60, "chunk_interval_s": 0.2})
    out: dict[str, bytes] = {}

    def read() -> None:
        with httpx.stream("POST", stack.base_url + "/v1/responses", json=body, timeout=30) as r:
            out["raw"] = r.read()

    t = threading.Thread(target=read)
    t.start()
    assert wait_for(lambda: stack.sim_requests(), timeout_s=5)
    rid = stack.sim_requests()[-1]["body"]["request_id"]
    assert wait_for(lambda: httpx.post(f"{second}/v1/responses/{rid}/cancel").status_code == 200,
                    timeout_s=3)
    t.join(10)
    events = parse_events(out["raw"])
    assert events[-1][0] == "error" and events[-1][1]["code"] == "response_cancelled"
    assert wait_for(lambda: stack.sim_stats()["aborted"] == 1, timeout_s=3)
    assert httpx.post(f"{second}/v1/responses/{rid}/cancel").status_code == 404  # ended
