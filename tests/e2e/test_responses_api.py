"""The Responses API through the gateway with the official ``openai`` client: create,
stream, a function tool, tiers, ``previous_response_id`` expanded by the gateway, stored
responses (GET/DELETE), ``store: false``, cancel of a running response, errors in the OpenAI
shape, and telemetry equal to the engine's usage."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import openai
import orjson
import pytest

from tests.e2e.helpers import metric, wait_for
from tests.e2e.protocol_helpers import RESPONSES, parse_events
from tests.e2e.stack import MODEL, Stack

pytestmark = pytest.mark.e2e

PRICES = {
    "standard": {"input_per_mtok_usd": 1.0, "cached_input_per_mtok_usd": 0.1,
                 "output_per_mtok_usd": 2.0},
    "fast": {"input_per_mtok_usd": 2.0, "cached_input_per_mtok_usd": 0.2,
             "output_per_mtok_usd": 6.0},
}
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather of a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                          "days": {"type": "integer"}},
                         "required": ["city", "days"]}}]
SIMPLE_EVENTS = [
    "response.created", "response.in_progress", "response.output_item.added",
    "response.content_part.added", "response.output_text.delta",
    "response.output_text.done", "response.content_part.done", "response.output_item.done",
    "response.completed",
]


def sent_body(stack: Stack, response_id: str) -> dict:
    """The body the engine received for ``response_id`` (the gateway's ``request_id``)."""
    (body,) = [e["body"] for e in stack.sim_requests()
               if isinstance(e["body"], dict) and e["body"].get("request_id") == response_id]
    return body


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("responses"),
              tier_overrides={t: {"prices": p} for t, p in PRICES.items()}).start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def oai(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.base_url + "/v1", api_key="unused", max_retries=0)


def test_create_non_stream(oai: openai.OpenAI, stack: Stack):
    raw = oai.responses.with_raw_response.create(
        model=MODEL, input="Say hello", instructions="Be brief.", max_output_tokens=8)
    r = raw.parse()
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.model == MODEL and r.service_tier == "default" and r.output_text
    assert raw.headers["x-speedgate-tier"] == "standard"
    assert int(raw.headers["x-speedgate-prompt-tokens"]) == r.usage.input_tokens
    assert int(raw.headers["x-speedgate-completion-tokens"]) == r.usage.output_tokens == 8
    sent = stack.sim_requests()[-1]["body"]
    # owned fields: the engine stores nothing and uses the gateway's response id
    assert sent["store"] is False and sent["request_id"] == r.id and r.id.startswith("resp_")
    assert sent["instructions"] == "Be brief." and sent["input"] == "Say hello"


def test_stream_events_in_vllm_order(oai: openai.OpenAI):
    events = list(oai.responses.create(model=MODEL, input="Hi", max_output_tokens=5,
                                       stream=True))
    types = [e.type for e in events]
    assert types[:4] == SIMPLE_EVENTS[:4] and types[-4:] == SIMPLE_EVENTS[-4:]
    assert set(types[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    assert final.model == MODEL and final.service_tier == "default"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert final.output_text == text and final.usage.output_tokens == 5


def test_typed_event_lines_and_priority_tier(stack: Stack):
    body = RESPONSES.body(stream=True, service_tier="priority")
    with httpx.stream("POST", stack.base_url + "/v1/responses", json=body) as r:
        raw = r.read()
    assert r.headers["x-speedgate-tier"] == "fast"
    events = parse_events(raw)
    assert all(name == doc["type"] for name, doc in events)
    assert events[0][1]["response"]["service_tier"] == "priority"
    assert events[-1][1]["response"]["service_tier"] == "priority"
    assert b"[DONE]" not in raw


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_function_tool(oai: openai.OpenAI, stream: bool):
    kwargs = {"model": f"{MODEL}-fast", "input": "Weather in Paris?", "tools": TOOLS}
    if stream:
        events = list(oai.responses.create(stream=True, **kwargs))
        deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
        assert len(deltas) == 8  # streamed as generated, not in one piece
        r = events[-1].response
    else:
        r = oai.responses.create(**kwargs)
    (call,) = [o for o in r.output if o.type == "function_call"]
    assert call.name == "get_weather" and call.call_id
    assert set(orjson.loads(call.arguments)) == {"city", "days"}
    assert r.service_tier == "priority"


def test_previous_response_id_is_expanded_by_the_gateway(oai: openai.OpenAI, stack: Stack):
    first = oai.responses.create(model=MODEL, input="Weather in Paris?", tools=TOOLS,
                                 instructions="You are an agent.")
    (call,) = [o for o in first.output if o.type == "function_call"]
    second = oai.responses.create(
        model=MODEL, previous_response_id=first.id, tools=TOOLS,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    assert second.previous_response_id == first.id
    sent = sent_body(stack, second.id)
    assert "previous_response_id" not in sent and sent["store"] is False
    # the engine got the whole conversation: turn 1's input, its output, then the new input
    assert [i.get("type", "message") for i in sent["input"]] == [
        "message", "function_call", "function_call_output"]
    assert sent["input"][1]["call_id"] == call.call_id
    assert "instructions" not in sent  # the previous instructions are not carried over
    third = list(oai.responses.create(model=MODEL, previous_response_id=second.id,
                                      input="Thanks", stream=True, max_output_tokens=4))
    assert third[-1].response.previous_response_id == second.id
    assert len(sent_body(stack, third[-1].response.id)["input"]) == 5


def test_stored_responses_get_and_delete(oai: openai.OpenAI):
    r = oai.responses.create(model=MODEL, input="Store me", max_output_tokens=6)
    got = oai.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text and got.status == r.status
    oai.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError) as e:
        oai.responses.retrieve(r.id)
    assert e.value.body["code"] == "response_not_found"
    with pytest.raises(openai.NotFoundError):  # a missing previous response is 404, not 500
        oai.responses.create(model=MODEL, input="again", previous_response_id=r.id)


def test_store_false_is_not_kept(oai: openai.OpenAI, stack: Stack):
    r = oai.responses.create(model=MODEL, input="Forget me", max_output_tokens=4, store=False)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(r.id)
    assert stack.sim_requests()[-1]["body"]["store"] is False


def test_bad_requests_are_openai_shaped(stack: Stack):
    with httpx.Client(base_url=stack.base_url, timeout=10) as c:
        cases = [
            ({"model": MODEL}, 400, "input"),
            ({"model": MODEL, "input": "x", "background": True}, 400, "background"),
            ({"model": "nope", "input": "x"}, 404, "model"),
            ({"model": MODEL, "input": "x", "service_tier": "turbo"}, 400, "service_tier"),
        ]
        for body, status, param in cases:
            r = c.post("/v1/responses", json=body)
            assert r.status_code == status, r.text
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}
            assert r.json()["error"]["param"] == param
        assert c.post("/v1/responses", content=b"{", headers={
            "content-type": "application/json"}).status_code == 400
        assert c.post("/v1/responses/resp_nope/cancel").status_code == 404


def test_cancel_a_running_response(stack: Stack):
    body = RESPONSES.body(stream=True, sim_faults={"chunks": ["x"] * 40, "chunk_interval_s": 0.2})
    seen: dict[str, object] = {}

    def read() -> None:
        with httpx.stream("POST", stack.base_url + "/v1/responses", json=body, timeout=30) as r:
            seen["raw"] = r.read()

    t = threading.Thread(target=read)
    t.start()
    assert wait_for(lambda: stack.sim_requests(), timeout_s=5)
    rid = stack.sim_requests()[-1]["body"]["request_id"]
    with httpx.Client(base_url=stack.base_url, timeout=10) as c:
        assert c.get(f"/v1/responses/{rid}").json()["status"] == "in_progress"
        r = c.post(f"/v1/responses/{rid}/cancel")
        assert r.status_code == 200 and r.json()["status"] == "cancelled"
        t.join(10)
        events = parse_events(seen["raw"])  # type: ignore[arg-type]
        assert events[-1][0] == "error" and events[-1][1]["code"] == "response_cancelled"
        assert not any(d["type"] == "response.completed" for _, d in events)
        assert wait_for(lambda: stack.sim_stats()["aborted"] == 1, timeout_s=3)
        assert c.post(f"/v1/responses/{rid}/cancel").status_code == 404  # gone, not stored
        done = c.post("/v1/responses", json=RESPONSES.body()).json()
        assert c.post(f"/v1/responses/{done['id']}/cancel").status_code == 400


def test_telemetry_equals_engine_usage(oai: openai.OpenAI, stack: Stack):
    """Known traffic on both tiers (a repeated long input, so the engine serves cached
    tokens): tokens, cached tokens and cost per tier in /metrics and /v1/usage equal the sum
    of the engine's usage."""
    session = f"s-{uuid.uuid4().hex}"
    names = ("input", "output", "cached_input")
    before = {(t, n): metric(stack, "gen_ai_client_token_usage_sum", tier=t,
                             gen_ai_token_type=n, gen_ai_operation_name="chat")
              for t in PRICES for n in names}
    cost_before = {t: metric(stack, "speedgate_cost_usd_total", tier=t) for t in PRICES}
    ttft_before = {t: metric(stack, "gen_ai_server_time_to_first_token_seconds_count", tier=t)
                   for t in PRICES}
    itl_before = {t: metric(stack, "gen_ai_client_operation_time_per_output_chunk_seconds_count",
                            tier=t) for t in PRICES}
    long_input = "the agent reads the repository file " * 120
    seen = {t: [0, 0, 0] for t in PRICES}
    deltas = {}
    for tier, model in (("standard", MODEL), ("fast", f"{MODEL}-fast")):
        for i in range(3):
            kw = {"model": model, "input": long_input, "max_output_tokens": 6,
                  "extra_headers": {"x-session-id": session}}
            if i == 2:
                events = list(oai.responses.create(stream=True, **kw))
                deltas[tier] = sum(e.type == "response.output_text.delta" for e in events)
                r = events[-1].response
            else:
                r = oai.responses.create(**kw)
            u = r.usage
            seen[tier][0] += u.input_tokens
            seen[tier][1] += u.output_tokens
            seen[tier][2] += u.input_tokens_details.cached_tokens
    assert seen["standard"][2] > 0  # the repeated prefix came from the engine's cache
    time.sleep(0.2)
    for t in PRICES:
        for k, n in enumerate(names):
            got = metric(stack, "gen_ai_client_token_usage_sum", tier=t, gen_ai_token_type=n,
                         gen_ai_operation_name="chat") - before[(t, n)]
            assert got == seen[t][k], (t, n)
        p = PRICES[t]
        cost = ((seen[t][0] - seen[t][2]) * p["input_per_mtok_usd"]
                + seen[t][2] * p["cached_input_per_mtok_usd"]
                + seen[t][1] * p["output_per_mtok_usd"]) / 1e6
        assert metric(stack, "speedgate_cost_usd_total", tier=t) - cost_before[t] == (
            pytest.approx(cost, rel=1e-6))
        # one stream per tier: one TTFT sample, and a gap sample per content event but one
        assert metric(stack, "gen_ai_server_time_to_first_token_seconds_count",
                      tier=t) - ttft_before[t] == 1
        assert metric(stack, "gen_ai_client_operation_time_per_output_chunk_seconds_count",
                      tier=t) - itl_before[t] == deltas[t] - 1
    assert "path=/v1/responses" in stack.log() and f"session_id={session}" in stack.log()
    totals = httpx.get(stack.base_url + "/v1/usage", params={"session_id": session}).json()
    assert totals["requests"] == 6
    assert totals["input_tokens"] == seen["standard"][0] + seen["fast"][0]
    assert totals["cached_input_tokens"] == seen["standard"][2] + seen["fast"][2]
    assert totals["output_tokens"] == seen["standard"][1] + seen["fast"][1]
