"""The simulator refuses what vLLM's request models refuse with vLLM's OpenAI-shaped 400 (never
a 500, which a gateway would count against the replica), and honours a body's ``sim_faults``
only when started with ``--accept-sim-faults``."""

from __future__ import annotations

import httpx
import pytest

from engines.sim.testing import start_sim

pytestmark = pytest.mark.e2e

MSG = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
BAD = [
    ("/v1/messages", {**MSG, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": 5}]}]}),
    ("/v1/messages", {**MSG, "tool_choice": {"type": {}}}),
    ("/v1/messages", {**MSG, "tools": [{"name": "f", "input_schema": {
        "type": "object", "properties": {"x": {"enum": 5}}}}]}),
    ("/v1/messages/count_tokens", {**MSG, "tools": [{"name": "f", "input_schema": {
        "items": [1]}}]}),
    ("/v1/responses", {"model": "m", "input": "hi", "tools": 1.5}),
    ("/v1/responses", {"model": "m", "input": "hi", "tool_choice": {"type": {}}}),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                              "tools": [{"type": "function", "function": {
                                  "name": "f", "parameters": {"items": [1]}}}]}),
]


@pytest.fixture(scope="module")
def gated():
    with start_sim(time_scale=0, model="m", accept_sim_faults=False) as s:
        yield s


@pytest.mark.parametrize(("path", "body"), BAD, ids=[f"{p}-{i}" for i, (p, _) in
                                                     enumerate(BAD)])
def test_a_body_vllm_refuses_is_a_400(gated, path, body):
    r = httpx.post(gated.url + path, json=body, timeout=10)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == 400  # vLLM's validation handler: OpenAI-shaped


def test_sim_faults_need_the_flag(gated):
    body = {**MSG, "sim_faults": {"crash": True}}
    r = httpx.post(gated.url + "/v1/messages", json=body, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "sim_faults"
    assert httpx.get(gated.url + "/health", timeout=5).status_code == 200  # still up
    with start_sim(time_scale=0, model="m") as open_sim:  # the tests' default: accepted
        r = httpx.post(open_sim.url + "/v1/messages", timeout=10,
                       json={**MSG, "sim_faults": {"status": 503}})
        assert r.status_code == 503
