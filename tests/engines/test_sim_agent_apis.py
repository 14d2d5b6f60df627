"""The simulator's Responses and Messages endpoints against vLLM 0.32's shapes, directly (no
gateway): event sequences and numbering, ids, usage fields, tool calls, stored-state 404s,
error shapes, count_tokens, and the stream faults on typed events."""

from __future__ import annotations

import anthropic
import httpx
import openai
import orjson
import pytest

from engines.sim.testing import SimProcess, start_sim

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def sim():
    with start_sim(time_scale=0, model="m") as s:
        yield s


def typed(raw: bytes) -> list[tuple[str, dict]]:
    out = []
    for block in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        lines = block.split(b"\n")
        name = [ln[7:].decode() for ln in lines if ln.startswith(b"event: ")]
        data = b"\n".join(ln[6:] for ln in lines if ln.startswith(b"data: "))
        if data:
            out.append((name[0] if name else "", orjson.loads(data)))
    return out


def stream(sim: SimProcess, path: str, body: dict) -> list[tuple[str, dict]]:
    with httpx.stream("POST", sim.url + path, json={**body, "stream": True}, timeout=10) as r:
        assert r.status_code == 200
        return typed(r.read())


def test_responses_stream_and_json_agree(sim: SimProcess) -> None:
    body = {"model": "m", "input": "Say something. " * 20, "max_output_tokens": 6,
            "request_id": "resp_given"}
    evs = stream(sim, "/v1/responses", body)
    assert [d["sequence_number"] for _, d in evs] == list(range(len(evs)))
    assert all(name == d["type"] for name, d in evs)
    assert evs[0][1]["response"]["status"] == "in_progress" and evs[0][1]["response"]["id"] == (
        "resp_given")
    final = evs[-1][1]["response"]
    assert final["status"] == "incomplete" and final["usage"]["output_tokens"] == 6
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    text = "".join(d["delta"] for _, d in evs if d["type"] == "response.output_text.delta")
    assert final["output"][0]["content"][0]["text"] == text
    full = httpx.post(sim.url + "/v1/responses", json=body).json()
    assert full["output"][0]["content"][0]["text"] == text  # deterministic text
    assert full["usage"]["input_tokens_details"]["cached_tokens"] > 0  # second time: cached
    for key in ("service_tier", "previous_response_id", "tools", "truncation", "store"):
        assert (key in full) == (key != "store")  # vLLM's response has no ``store`` field


def test_responses_function_call_and_not_stored(sim: SimProcess) -> None:
    tools = [{"type": "function", "name": "f", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}]
    client = openai.OpenAI(base_url=sim.base_url, api_key="x", max_retries=0)
    r = client.responses.create(model="m", input="call f", tools=tools)
    (call,) = r.output
    assert call.type == "function_call" and call.name == "f"
    assert orjson.loads(call.arguments).keys() == {"n"}
    with pytest.raises(openai.NotFoundError):  # vLLM without its store keeps nothing
        client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="m", input="again", previous_response_id=r.id)


def test_messages_stream_usage_and_json(sim: SimProcess) -> None:
    body = {"model": "m", "max_tokens": 4, "system": "S",
            "messages": [{"role": "user", "content": "Say something."}]}
    evs = stream(sim, "/v1/messages", body)
    start, delta = evs[0][1], evs[-2][1]
    assert start["message"]["usage"] == {"input_tokens": start["message"]["usage"][
        "input_tokens"], "output_tokens": 0}
    u = delta["usage"]
    assert u["input_tokens"] + u["cache_read_input_tokens"] == start["message"]["usage"][
        "input_tokens"]  # the end splits the prompt into uncached and cache reads
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    client = anthropic.Anthropic(base_url=sim.url, api_key="x", max_retries=0)
    m = client.messages.create(**body)
    assert m.id.startswith("chatcmpl-") and m.stop_reason == "max_tokens"
    assert client.messages.count_tokens(model="m", system="S", messages=body["messages"]
                                        ).input_tokens == m.usage.input_tokens + (
        m.usage.cache_read_input_tokens or 0)


def test_messages_errors_and_faults(sim: SimProcess) -> None:
    msgs = [{"role": "user", "content": "x"}]
    r = httpx.post(sim.url + "/v1/messages", json={"model": "nope", "max_tokens": 4,
                                                   "messages": msgs})
    assert r.status_code == 404 and r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "NotFoundError"
    r = httpx.post(sim.url + "/v1/messages", json={"model": "m", "messages": msgs})
    assert r.status_code == 400 and "error" in r.json() and "type" not in r.json()  # schema
    evs = stream(sim, "/v1/messages", {"model": "m", "max_tokens": 8, "messages": msgs,
                                       "sim_faults": {"chunks": ["a", "b"], "comments": True,
                                                      "crlf": True}})
    assert [d["delta"]["text"] for _, d in evs if d["type"] == "content_block_delta"] == [
        "a", "b"]
    with httpx.stream("POST", sim.url + "/v1/responses", json={
            "model": "m", "input": "x", "stream": True,
            "sim_faults": {"chunks": ["a", "b", "c"], "reset_after_chunks": 2}}) as resp:
        with pytest.raises(httpx.RemoteProtocolError):
            resp.read()
