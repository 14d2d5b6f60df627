"""Telemetry end to end: exact metric counts after known traffic, cost, trace propagation,
estimated usage on a broken stream, per-session totals across gateway replicas (Redis)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import orjson
import pytest

from gateway.common.usage import Usage
from gateway.config import Prices
from gateway.telemetry.cost import cost_usd
from gateway.telemetry.tokencount import count_text
from tests.e2e.helpers import CHAT, metric, stream_events
from tests.e2e.stack import MODEL, Stack

pytestmark = pytest.mark.e2e

PRICES = {
    "standard": {"input_per_mtok_usd": 1.0, "cached_input_per_mtok_usd": 0.1,
                 "output_per_mtok_usd": 2.0},
    "fast": {"input_per_mtok_usd": 2.0, "cached_input_per_mtok_usd": 0.2,
             "output_per_mtok_usd": 6.0},
}
REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("tel"), config_extra={"state": {"redis_url": REDIS_URL}},
              tier_overrides={t: {"prices": p} for t, p in PRICES.items()})
    s.start()
    try:
        yield s
    finally:
        s.stop()


def _usage(doc: dict) -> Usage:
    u = Usage.from_openai(doc["usage"])
    assert u is not None
    return u


def test_metrics_count_requests_tokens_and_cost_exactly(stack: Stack):
    base = lambda name, **kw: metric(stack, name, **kw)  # noqa: E731
    before = {t: base("speedgate_requests_total", tier=t, outcome="ok") for t in PRICES}
    before_out = {t: base("gen_ai_client_token_usage_sum", tier=t, gen_ai_token_type="output")
                  for t in PRICES}
    before_in = {t: base("gen_ai_client_token_usage_sum", tier=t, gen_ai_token_type="input")
                 for t in PRICES}
    before_dur = {t: base("gen_ai_server_request_duration_seconds_count", tier=t)
                  for t in PRICES}
    before_ttft = base("gen_ai_server_time_to_first_token_seconds_count", tier="fast")
    before_cost = {t: base("speedgate_cost_usd_total", tier=t) for t in PRICES}
    usages: dict[str, list[Usage]] = {"standard": [], "fast": []}
    with httpx.Client(base_url=stack.base_url, timeout=30) as c:
        for _ in range(3):
            r = c.post(CHAT, json={"model": MODEL, "max_tokens": 5,
                                   "messages": [{"role": "user", "content": "count me"}]})
            assert r.status_code == 200
            u = _usage(r.json())
            usages["standard"].append(u)
            assert float(r.headers["x-speedgate-cost-usd"]) == pytest.approx(
                cost_usd(u, Prices(**PRICES["standard"])), abs=1e-8)
            assert int(r.headers["x-speedgate-completion-tokens"]) == 5
        for _ in range(2):  # streams, usage asked for by the gateway and stripped
            body = {"model": f"{MODEL}-fast", "max_tokens": 7, "stream": True,
                    "messages": [{"role": "user", "content": "stream me"}]}
            events = [orjson.loads(d) for _, d, _ in stream_events(c, body) if d != b"[DONE]"]
            assert all(e["choices"] for e in events)
            sent = stack.sim_requests("fast")[-1]["body"]
            assert sent["stream_options"] == {"include_usage": True}
            usages["fast"].append(Usage(prompt=-1, completion=7))
    for tier, n in (("standard", 3), ("fast", 2)):
        assert base("speedgate_requests_total", tier=tier, outcome="ok") - before[tier] == n
        assert base("gen_ai_server_request_duration_seconds_count", tier=tier) \
            - before_dur[tier] == n
        out = base("gen_ai_client_token_usage_sum", tier=tier, gen_ai_token_type="output")
        assert out - before_out[tier] == sum(u.completion for u in usages[tier])
    prompt_std = sum(u.prompt for u in usages["standard"])
    assert base("gen_ai_client_token_usage_sum", tier="standard", gen_ai_token_type="input") \
        - before_in["standard"] == prompt_std
    assert base("gen_ai_server_time_to_first_token_seconds_count", tier="fast") \
        - before_ttft == 2
    expected_std = sum(cost_usd(u, Prices(**PRICES["standard"])) for u in usages["standard"])
    assert base("speedgate_cost_usd_total", tier="standard") - before_cost["standard"] \
        == pytest.approx(expected_std, rel=1e-9)
    fast_in = base("gen_ai_client_token_usage_sum", tier="fast", gen_ai_token_type="input") \
        - before_in["fast"]
    expected_fast = (fast_in * 2.0 + 14 * 6.0) / 1e6  # nothing cached: same short prompts
    assert base("speedgate_cost_usd_total", tier="fast") - before_cost["fast"] \
        == pytest.approx(expected_fast, rel=1e-9)


def test_traceparent_reaches_the_engine(stack: Stack):
    trace_id = uuid.uuid4().hex
    tp = f"00-{trace_id}-{'ab' * 8}-01"
    r = httpx.post(stack.base_url + CHAT, headers={"traceparent": tp},
                   json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 200
    got = stack.sim_requests()[-1]["headers"]["traceparent"]
    assert got.split("-")[1] == trace_id


def test_estimated_usage_on_a_broken_stream(stack: Stack):
    before = metric(stack, "speedgate_usage_estimated_total", tier="standard")
    before_out = metric(stack, "gen_ai_client_token_usage_sum", tier="standard",
                        gen_ai_token_type="output")
    # broken inside a tool call (which cannot be resumed): the engine never reports usage
    chunks = ["alpha ", "beta ", "gamma ", "delta "]
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "x"}],
            "tools": tools, "sim_faults": {"chunks": chunks, "reset_after_chunks": 3,
                                           "tool_call_after_chunks": 2}}
    with httpx.Client(base_url=stack.base_url, timeout=30) as c:
        docs = [orjson.loads(d) for _, d, _ in stream_events(c, body)]
    assert "error" in docs[-1]
    assert metric(stack, "speedgate_usage_estimated_total", tier="standard") == before + 1
    relayed = count_text("alpha beta lookup")  # content, then the tool call's name
    out = metric(stack, "gen_ai_client_token_usage_sum", tier="standard",
                 gen_ai_token_type="output")
    assert out - before_out == relayed


def test_session_totals_across_two_gateways_sharing_redis(stack: Stack):
    second = stack.add_gateway()
    session = f"s-{uuid.uuid4().hex}"
    usages = []
    for url in (stack.base_url, second, stack.base_url):
        r = httpx.post(url + CHAT, headers={"x-session-id": session},
                       json={"model": MODEL, "max_tokens": 3,
                             "messages": [{"role": "user", "content": "agent turn"}]})
        assert r.status_code == 200
        usages.append(_usage(r.json()))
    for url in (stack.base_url, second):
        totals = httpx.get(url + "/v1/usage", params={"session_id": session}).json()
        assert totals["requests"] == 3
        assert totals["output_tokens"] == 9
        assert totals["input_tokens"] == sum(u.prompt for u in usages)
        assert totals["cost_usd"] == pytest.approx(
            sum(cost_usd(u, Prices(**PRICES["standard"])) for u in usages), rel=1e-9)
    bad = httpx.get(stack.base_url + "/v1/usage")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "session_id"
