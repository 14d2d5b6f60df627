"""The stream failure cases of ../shared/cases/failure-cases.md re-run on the Responses API and
Anthropic Messages: UTF-8 split, comments and framing, resets before and after
content, stalls, TTFT from the protocol's first content event, 429 with Retry-After, and
client disconnects, each through the gateway against simulators scripted to misbehave."""

from __future__ import annotations

import time
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from tests.e2e.helpers import metric, wait_for
from tests.e2e.protocol_helpers import MESSAGES, PROTOS, RESPONSES, Proto, post_stream
from tests.e2e.stack import MODEL, Stack

pytestmark = pytest.mark.e2e

TIMEOUTS = {"connect_s": 1, "ttft_s": 1.0, "stall_s": 1.0, "total_s": 30}
POOL = {"outlier": {"consecutive_failures": 3, "base_ejection_s": 0.5},
        "retry": {"budget_percent": 100, "budget_min_retries": 20}}
IDS = [p.name for p in PROTOS]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("proto"), timeouts=TIMEOUTS, pool_overrides=POOL).start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(autouse=True)
def _fresh(stack: Stack) -> None:
    """Every test starts with all replicas usable (ejections from earlier tests expired)."""

    def usable() -> bool:
        tiers = httpx.get(stack.base_url + "/readyz").json()["models"][MODEL]
        return all(t["usable"] == t["replicas"] for t in tiers.values())

    assert wait_for(usable, timeout_s=5)


@pytest.fixture
def http(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.base_url, timeout=30) as c:
        yield c


def _sdk_text(stack: Stack, proto: Proto, faults: dict) -> str:
    """Stream through the official SDK of ``proto`` and join the text it yields."""
    if proto is RESPONSES:
        client = openai.OpenAI(base_url=stack.base_url + "/v1", api_key="x", max_retries=0)
        stream = client.responses.create(model=MODEL, input="hi", stream=True,
                                         extra_body={"sim_faults": faults})
        events = list(stream)
        assert events[-1].type == "response.completed"
        return "".join(e.delta for e in events if e.type == "response.output_text.delta")
    client_a = anthropic.Anthropic(base_url=stack.base_url, api_key="x", max_retries=0)
    with client_a.messages.stream(model=MODEL, max_tokens=64, extra_body={"sim_faults": faults},
                                  messages=[{"role": "user", "content": "hi"}]) as s:
        return "".join(s.text_stream)


@pytest.mark.parametrize("proto", PROTOS, ids=IDS)
def test_sse_utf8_split(stack: Stack, proto: Proto):
    text = "안녕하세요 👋"
    got = _sdk_text(stack, proto, {"chunks": [text], "utf8_split": True, "split_pause_s": 0.05})
    assert got == text and "\ufffd" not in got
    assert stack.sim_requests()[-1]["body"]["sim_faults"]["utf8_split"] is True


@pytest.mark.parametrize("proto", PROTOS, ids=IDS)
def test_sse_comments_crlf_multiline_typed_events(http: httpx.Client, stack: Stack, proto: Proto):
    faults = {"chunks": ["a", "b", "c"], "comments": True, "crlf": True, "multiline_data": True}
    assert _sdk_text(stack, proto, faults) == "abc"
    r, events = post_stream(http, proto, proto.body(sim_faults=faults))
    assert r.headers["content-type"].startswith("text/event-stream")
    assert all(name == doc["type"] for name, doc in events)  # every event keeps its type line
    assert events[-1][0] == proto.terminal and proto.text(events) == "abc"
    assert b": keepalive" not in r.content  # the engine's comments are not relayed


@pytest.mark.parametrize("proto", PROTOS, ids=IDS)
@pytest.mark.parametrize("fault", [{"reset_after_chunks": 0}, {"malformed_after_chunks": 0}],
                         ids=["reset", "malformed"])
def test_fallback_before_content(http: httpx.Client, stack: Stack, proto: Proto, fault: dict):
    for url in stack.sims["fast"]:
        httpx.post(url + "/sim/faults", json=fault).raise_for_status()
    body = proto.body(sim_faults={"chunks": ["clean ", "and ", "complete"]}) | {
        "model": f"{MODEL}-fast"}
    r, events = post_stream(http, proto, body)
    assert r.status_code == 200 and events[-1][0] == proto.terminal
    assert proto.text(events) == "clean and complete"  # nothing of the failed attempts
    starts = [d for _, d in events if d["type"] in ("response.created", "message_start")]
    assert len(starts) == 1  # one response.created / message_start, not one per attempt
    assert r.headers["x-speedgate-tier"] == "standard"
    assert r.headers["x-speedgate-fallback"].startswith("fast:")
    assert len(stack.sim_requests("fast")) >= 1


@pytest.mark.parametrize("proto", PROTOS, ids=IDS)
def test_upstream_reset_midstream(http: httpx.Client, stack: Stack, proto: Proto):
    before = metric(stack, "speedgate_requests_total", outcome="upstream_error")
    faults = {"chunks": ["a", "b", "c", "d", "e"], "reset_after_chunks": 3}
    r, events = post_stream(http, proto, proto.body(sim_faults=faults))
    assert r.status_code == 200
    assert proto.text(events[:-1]) == "abc"
    name, last = events[-1]
    assert name == "error"  # one in-band error event of the protocol's own kind
    kind, _ = proto.error(last)
    assert kind == ("upstream_error" if proto is RESPONSES else "api_error")
    assert not any(d["type"] in (proto.terminal, "message_delta") for _, d in events)
    if proto is RESPONSES:  # the error event continues the stream's numbering
        assert last["sequence_number"] == events[-2][1]["sequence_number"] + 1
    assert wait_for(lambda: metric(stack, "speedgate_requests_total",
                                   outcome="upstream_error") == before + 1)
    # a Responses or Messages stream is resumed on another replica (through its chat
    # endpoint); this continuation replays the same scripted chunks from the start, diverges
    # from "abc" and the break is reported in-band
    requests = stack.sim_requests()
    assert sorted(r["path"] for r in requests) == sorted([proto.path, "/v1/chat/completions"])


@pytest.mark.parametrize("proto", PROTOS, ids=IDS)
def test_stall_is_an_in_band_timeout(http: httpx.Client, stack: Stack, proto: Proto):
    faults = {"chunks": ["a", "b", "c", "d"], "stall_after_chunks": 3, "stall_s": 40}
    t0 = time.monotonic()
    _, events = post_stream(http, proto, proto.body(sim_faults=faults))
    assert proto.text(events[:-1]) == "abc"
    kind, message = proto.error(events[-1][1])
    assert kind == ("upstream_timeout" if proto is RESPONSES else "timeout_error")
    assert "stall" in message
    assert time.monotonic() - t0 < 4  # ~1 s stall limit, not the engine's 40 s
    # the stalled stream is resumed once on another replica, whose continuation replays the
    # scripted chunks and stalls too; each stalled request is aborted
    assert wait_for(lambda: stack.sim_stats()["aborted"] == 2, timeout_s=2), stack.sim_stats()


@pytest.mark.parametrize("proto", PROTOS, ids=IDS)
def test_ttft_counts_from_the_first_content_event(http: httpx.Client, stack: Stack, proto: Proto):
    """``response.created`` / ``message_start`` arrive at once, then the engine stalls: they
    are not a first token, so the TTFT timeout (1 s) fires on each replica, then 504."""
    t0 = time.monotonic()
    r, events = post_stream(http, proto, proto.body(
        sim_faults={"stall_after_chunks": 0, "stall_s": 10}))
    elapsed = time.monotonic() - t0
    assert r.status_code == 504
    kind, message = proto.error(events[0][1])
    assert kind == ("upstream_timeout" if proto is RESPONSES else "timeout_error")
    assert "ttft" in message
    assert 1.9 <= elapsed < 4.0  # one 1 s TTFT timeout per replica of the pool
    assert wait_for(lambda: stack.sim_stats("standard")["aborted"] == 2, timeout_s=2)


@pytest.mark.parametrize("proto", PROTOS, ids=IDS)
def test_429_on_one_replica_is_served_elsewhere(http: httpx.Client, stack: Stack, proto: Proto):
    busy = stack.sims["standard"][0]
    httpx.post(busy + "/sim/faults", json={"status": 429, "retry_after": 30}).raise_for_status()
    for _ in range(4):
        t0 = time.monotonic()
        r, events = post_stream(http, proto, proto.body())
        assert r.status_code == 200 and events[-1][0] == proto.terminal
        assert time.monotonic() - t0 < 1.0  # no Retry-After wait: another replica at once


@pytest.mark.parametrize("proto", PROTOS, ids=IDS)
def test_429_everywhere_passes_through_with_retry_after(http: httpx.Client, proto: Proto):
    faults = {"status": 429, "retry_after": 30, "error_message": "busy"}
    r = http.post(proto.path, json=proto.body(sim_faults=faults))
    assert r.status_code == 429 and r.headers["retry-after"] == "30"
    kind, message = proto.error(r.json())
    assert message == "busy"
    if proto is MESSAGES:
        assert kind == "rate_limit_error" and r.json()["request_id"] == r.headers["request-id"]
    else:
        assert r.json()["error"]["type"] == "rate_limit_error"


def _assert_aborted_and_released(stack: Stack, status_before: float) -> None:
    assert wait_for(lambda: stack.sim_stats()["aborted"] == 1, timeout_s=2.0), stack.sim_stats()
    assert wait_for(lambda: metric(stack, "speedgate_replica_inflight") == 0, timeout_s=2.0)
    assert wait_for(
        lambda: metric(stack, "speedgate_requests_total", status="499") == status_before + 1
    )


@pytest.mark.parametrize("proto", PROTOS, ids=IDS)
def test_disconnect_aborts_non_streaming(stack: Stack, proto: Proto):
    before = metric(stack, "speedgate_requests_total", status="499")
    body = proto.body(sim_faults={"ttft_delay_s": 30})
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(stack.base_url + proto.path, json=body, timeout=httpx.Timeout(30, read=1.0))
    _assert_aborted_and_released(stack, before)


@pytest.mark.parametrize("proto", PROTOS, ids=IDS)
def test_disconnect_aborts_streaming_after_first_token(stack: Stack, proto: Proto):
    before = metric(stack, "speedgate_requests_total", status="499")
    body = proto.body(stream=True, sim_faults={"chunks": ["x"] * 100, "chunk_interval_s": 0.5})
    delta = "output_text.delta" if proto is RESPONSES else "text_delta"
    with httpx.stream("POST", stack.base_url + proto.path, json=body, timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if delta in line:
                break  # got the first token: close the connection now
    _assert_aborted_and_released(stack, before)
    assert stack.sim_stats()["completed"] == 0


@pytest.mark.parametrize("proto", PROTOS, ids=IDS)
def test_disconnect_aborts_streaming_before_first_token(stack: Stack, proto: Proto):
    before = metric(stack, "speedgate_requests_total", status="499")
    body = proto.body(stream=True, sim_faults={"ttft_delay_s": 30})
    # the client leaves at 0.4 s, well before the gateway's own 1 s TTFT timeout would retry
    with pytest.raises(httpx.ReadTimeout), httpx.stream(
        "POST", stack.base_url + proto.path, json=body, timeout=httpx.Timeout(30, read=0.4)
    ) as r:
        r.read()
    _assert_aborted_and_released(stack, before)
