"""Upstreams that are not vLLM, with the official clients: typed events written as bare
``data:`` lines get their ``event:`` names from ``type``; HTTP 529 and an in-stream
``overloaded_error`` are an overload (retried elsewhere, answered 529 when every replica is
overloaded), not a 500."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

from tests.e2e.helpers import metric
from tests.e2e.protocol_helpers import parse_events
from tests.e2e.stack import MODEL, Stack

pytestmark = pytest.mark.e2e
USER = [{"role": "user", "content": "Tell me about the weather."}]
BARE = {"sim_faults": {"no_event_lines": True}}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    s = Stack(tmp_path_factory.mktemp("r3up"), tiers=("standard",),
              pool_overrides={"retry": {"budget_min_retries": 50}}).start()
    try:
        yield s
    finally:
        s.stop()


def test_r3_messages_bare_data_lines_get_event_names(stack: Stack) -> None:
    client = anthropic.Anthropic(base_url=stack.base_url, api_key="unused", max_retries=0)
    with client.messages.stream(model=MODEL, max_tokens=8, messages=USER,
                                extra_body=BARE) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text and final.content[0].text == text and final.usage.output_tokens == 8
    with httpx.stream("POST", stack.base_url + "/v1/messages",
                      json={"model": MODEL, "max_tokens": 3, "messages": USER, "stream": True,
                            **BARE}) as r:
        events = parse_events(r.read())
    assert len(events) == 8 and all(name == doc["type"] for name, doc in events)


def test_r3_responses_bare_data_lines_get_event_names(stack: Stack) -> None:
    oai = openai.OpenAI(base_url=stack.base_url + "/v1", api_key="unused", max_retries=0)
    with oai.responses.stream(model=MODEL, input="Hi", max_output_tokens=6,
                              extra_body=BARE) as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert len(deltas) == 6 and final.output_text == "".join(deltas)
    with httpx.stream("POST", stack.base_url + "/v1/responses",
                      json={"model": MODEL, "input": "Hi", "max_output_tokens": 3,
                            "stream": True, **BARE}) as r:
        events = parse_events(r.read())
    assert events and all(name == doc["type"] for name, doc in events)


def _overload_one(stack: Stack, faults: dict) -> None:
    """Script ``faults`` on the replica the gateway routes ``USER`` to (session affinity)."""
    r = httpx.post(stack.base_url + "/v1/messages", timeout=10,
                   json={"model": MODEL, "max_tokens": 1, "messages": USER})
    url = stack.sims["standard"][int(r.headers["x-speedgate-replica"].rsplit("/", 1)[1])]
    httpx.post(url + "/sim/faults", json=faults, timeout=5).raise_for_status()


@pytest.mark.parametrize("faults", [
    {"status": 529, "error_type": "overloaded_error", "error_message": "Overloaded"},
    {"error_after_chunks": 0, "error_code": 529, "error_type": "overloaded_error",
     "error_message": "Overloaded"},
], ids=["http-529", "in-stream-overloaded_error"])
def test_r3_overloaded_replica_is_retried_elsewhere_not_ejected(stack: Stack, faults: dict
                                                                ) -> None:
    _overload_one(stack, faults)
    client = anthropic.Anthropic(base_url=stack.base_url, api_key="unused", max_retries=0)
    before = metric(stack, "speedgate_upstream_attempts_total", result="overloaded")
    ejections = metric(stack, "speedgate_replica_ejections_total")
    for _ in range(8):  # more than outlier.consecutive_failures (5) on the overloaded replica
        with client.messages.stream(model=MODEL, max_tokens=4, messages=USER) as s:
            assert "".join(s.text_stream)
    overloaded = metric(stack, "speedgate_upstream_attempts_total", result="overloaded")
    assert overloaded > before  # the overloaded replica was asked, and the answer came anyway
    assert metric(stack, "speedgate_replica_ejections_total") == ejections  # busy, not broken


@pytest.mark.parametrize("faults", [
    {"status": 529, "error_type": "overloaded_error", "error_message": "Overloaded"},
    {"error_after_chunks": 0, "error_code": 529, "error_type": "overloaded_error",
     "error_message": "Overloaded"},
], ids=["http-529", "in-stream-overloaded_error"])
def test_r3_every_replica_overloaded_is_a_529(stack: Stack, faults: dict) -> None:
    for url in stack.sims["standard"]:
        httpx.post(url + "/sim/faults", json=faults, timeout=5).raise_for_status()
    client = anthropic.Anthropic(base_url=stack.base_url, api_key="unused", max_retries=0)
    with pytest.raises(anthropic.OverloadedError) as ov:
        with client.messages.stream(model=MODEL, max_tokens=4, messages=USER) as s:
            "".join(s.text_stream)
    assert ov.value.status_code == 529 and ov.value.body["error"]["type"] == "overloaded_error"
    with pytest.raises(anthropic.OverloadedError):
        client.messages.create(model=MODEL, max_tokens=4, messages=USER)
    oai = openai.OpenAI(base_url=stack.base_url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.InternalServerError) as ie:
        oai.chat.completions.create(model=MODEL, messages=USER, max_tokens=4)
    assert ie.value.status_code == 503 and ie.value.body["code"] == "upstream_overloaded"
