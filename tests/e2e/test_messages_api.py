"""Anthropic Messages through the gateway with the official ``anthropic`` client:
``messages.create`` with a system prompt, ``messages.stream``, tool use and tool results,
``count_tokens`` on the default pool, tiers, errors in Anthropic's shape and statuses, and
telemetry equal to the engine's usage (``cache_read_input_tokens`` counted as cached)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import anthropic
import httpx
import pytest

from tests.e2e.helpers import metric
from tests.e2e.protocol_helpers import MESSAGES, parse_events
from tests.e2e.stack import MODEL, Stack

pytestmark = pytest.mark.e2e

PRICES = {
    "standard": {"input_per_mtok_usd": 3.0, "cached_input_per_mtok_usd": 0.3,
                 "output_per_mtok_usd": 15.0},
    "fast": {"input_per_mtok_usd": 6.0, "cached_input_per_mtok_usd": 0.6,
             "output_per_mtok_usd": 30.0},
}
TOOLS = [{"name": "get_weather", "description": "Weather of a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}]
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("messages"),
              tier_overrides={t: {"prices": p} for t, p in PRICES.items()}).start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def client(stack: Stack) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=stack.base_url, api_key="unused", max_retries=0)


def _prompt(u: anthropic.types.Usage) -> int:
    return u.input_tokens + (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens or 0)


def test_create_with_system_prompt(client: anthropic.Anthropic, stack: Stack):
    raw = client.messages.with_raw_response.create(
        model=MODEL, max_tokens=8, system="You are terse.", messages=USER)
    m = raw.parse()
    assert m.type == "message" and m.role == "assistant" and m.model == MODEL
    assert m.content[0].type == "text" and m.content[0].text
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 8
    assert m.usage.service_tier == "standard"
    assert raw.headers["request-id"] and raw.headers["x-speedgate-tier"] == "standard"
    assert int(raw.headers["x-speedgate-prompt-tokens"]) == _prompt(m.usage)
    sent = stack.sim_requests()[-1]
    assert sent["path"] == "/v1/messages" and sent["body"]["system"] == "You are terse."


def test_stream_text_and_final_message(client: anthropic.Anthropic):
    with client.messages.stream(model=f"{MODEL}-fast", max_tokens=12, messages=USER) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text and final.content[0].text == text
    assert final.model == MODEL and final.usage.service_tier == "priority"
    assert final.usage.output_tokens == 12 and _prompt(final.usage) > 0


def test_typed_events_in_vllm_order(stack: Stack):
    with httpx.stream("POST", stack.base_url + "/v1/messages",
                      json=MESSAGES.body(stream=True, max_tokens=3)) as r:
        events = parse_events(r.read())
    types = [d["type"] for _, d in events]
    assert types == ["message_start", "content_block_start", *["content_block_delta"] * 3,
                     "content_block_stop", "message_delta", "message_stop"]
    assert all(name == doc["type"] for name, doc in events)
    assert events[0][1]["message"]["model"] == MODEL
    assert r.headers["cache-control"] == "no-cache" and r.headers["x-accel-buffering"] == "no"


def test_tool_use_and_tool_result(client: anthropic.Anthropic, stack: Stack):
    m = client.messages.create(model=MODEL, max_tokens=64, tools=TOOLS, messages=USER)
    (call,) = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and call.name == "get_weather"
    assert set(call.input) == {"city"}
    # tool_choice any: a call again (after a tool result the model answers text by default)
    with client.messages.stream(model=MODEL, max_tokens=64, tools=TOOLS,
                                tool_choice={"type": "any"}, messages=[
        *USER,
        {"role": "assistant", "content": [{"type": "tool_use", "id": call.id,
                                           "name": call.name, "input": call.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                      "content": "sunny"}]},
    ]) as s:
        events = list(s)
        final = s.get_final_message()
    partial = [e for e in events if e.type == "input_json"]
    assert len(partial) == 8  # argument deltas relayed as generated
    assert final.stop_reason == "tool_use" and final.content[-1].type == "tool_use"
    sent = stack.sim_requests()
    last = [e["body"] for e in sent if isinstance(e["body"], dict) and e["body"].get("stream")]
    assert last[-1]["messages"][-1]["content"][0]["tool_use_id"] == call.id  # forwarded as is


def test_count_tokens_uses_the_default_pool(client: anthropic.Anthropic, stack: Stack):
    counted = client.messages.count_tokens(model=f"{MODEL}-fast", system="Be terse.",
                                           messages=USER)
    (req,) = stack.sim_requests()
    assert req["path"] == "/v1/messages/count_tokens"
    assert req in stack.sim_requests("standard")  # the model's default pool, whatever alias
    m = client.messages.create(model=MODEL, max_tokens=1, system="Be terse.", messages=USER)
    assert counted.input_tokens == _prompt(m.usage)


def test_errors_are_anthropic_shaped(client: anthropic.Anthropic, stack: Stack):
    with pytest.raises(anthropic.NotFoundError) as nf:
        client.messages.create(model="nope", max_tokens=5, messages=USER)
    assert nf.value.body["error"]["type"] == "not_found_error"
    assert nf.value.body["request_id"] == nf.value.response.headers["request-id"]
    with httpx.Client(base_url=stack.base_url, timeout=10) as c:
        r = c.post("/v1/messages", json={"model": MODEL, "messages": USER})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        assert set(r.json()) == {"type", "error", "request_id"}
        r = c.post("/v1/messages", content=b"[1]", headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["type"] == "error"
        r = c.post("/v1/messages", content=b"{}", headers={"content-type": "text/plain"})
        assert r.status_code == 415 and r.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.InternalServerError) as ie:  # engine 500 everywhere
        client.messages.create(model=MODEL, max_tokens=5, messages=USER,
                               extra_body={"sim_faults": {"status": 500}})
    assert ie.value.status_code == 500 and ie.value.body["error"]["type"] == "api_error"


def test_telemetry_equals_engine_usage(client: anthropic.Anthropic, stack: Stack):
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
    long_user = [{"role": "user", "content": "the agent reads the repository file " * 120}]
    seen = {t: [0, 0, 0] for t in PRICES}
    deltas = {}
    for tier, model in (("standard", MODEL), ("fast", f"{MODEL}-fast")):
        for i in range(3):
            kw = {"model": model, "max_tokens": 6, "messages": long_user,
                  "extra_headers": {"x-session-id": session}}
            if i == 2:
                with client.messages.stream(**kw) as s:
                    deltas[tier] = sum(e.type == "content_block_delta" for e in s)
                    u = s.get_final_message().usage
            else:
                u = client.messages.create(**kw).usage
            seen[tier][0] += _prompt(u)
            seen[tier][1] += u.output_tokens
            seen[tier][2] += u.cache_read_input_tokens or 0
    assert seen["standard"][2] > 0  # repeated prefix: cache reads reported by the engine
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
    assert "path=/v1/messages" in stack.log() and f"session_id={session}" in stack.log()
    totals = httpx.get(stack.base_url + "/v1/usage", params={"session_id": session}).json()
    assert totals["requests"] == 6
    assert totals["input_tokens"] == seen["standard"][0] + seen["fast"][0]
    assert totals["cached_input_tokens"] == seen["standard"][2] + seen["fast"][2]
    assert totals["output_tokens"] == seen["standard"][1] + seen["fast"][1]


def test_auto_tier_and_header_tier(client: anthropic.Anthropic):
    raw = client.messages.with_raw_response.create(model=f"{MODEL}-auto", max_tokens=4,
                                                   messages=USER)
    served = raw.headers["x-speedgate-tier"]
    assert raw.headers["x-speedgate-auto-reason"]  # the auto tier decided, and says why
    assert raw.parse().usage.service_tier == ("priority" if served == "fast" else "standard")
    raw = client.messages.with_raw_response.create(
        model=MODEL, max_tokens=4, messages=USER, extra_headers={"x-speedgate-tier": "fast"})
    assert raw.headers["x-speedgate-tier"] == "fast"
    raw = client.messages.with_raw_response.create(
        model=f"{MODEL}-fast", max_tokens=4, messages=USER,
        extra_body={"service_tier": "standard_only"})
    assert raw.headers["x-speedgate-tier"] == "fast"  # the alias wins over the body's hint


@pytest.mark.parametrize("method,path", [
    ("GET", "/v1/messages"),                 # 405
    ("GET", "/v1/messages/count_tokens"),    # 405
    ("POST", "/v1/messages/batches"),        # 404
    ("GET", "/v1/messages/foo"),             # 404
])
def test_route_errors_body_request_id_is_the_header(stack: Stack, method: str, path: str):
    """Messages-shaped 404/405 answers carry in the body the `request_id` of the answer's
    `x-request-id` (as every other Messages error does), so a user who quotes the body's id
    is found in the access log."""
    r = httpx.request(method, stack.base_url + path, json={}, timeout=10)
    assert r.status_code in (404, 405)
    assert r.json()["type"] == "error"
    assert r.json()["request_id"] == r.headers["x-request-id"]
