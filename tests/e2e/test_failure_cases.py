"""Failure cases from shared/cases/failure-cases.md (SSE relay, body shapes, disconnects),
each against the real gateway in front of simulators scripted to misbehave."""

from __future__ import annotations

import itertools
import statistics
import time

import httpx
import openai
import orjson
import pytest

from tests.e2e.helpers import CHAT, metric, stream_events, wait_for
from tests.e2e.stack import MODEL, Stack

pytestmark = pytest.mark.e2e

def _msgs(text: str = "hello") -> list[dict]:
    return [{"role": "user", "content": text}]


@pytest.fixture
def http(stack: Stack):
    with httpx.Client(base_url=stack.base_url, timeout=30) as c:
        yield c


@pytest.fixture
def oai(stack: Stack):
    return openai.OpenAI(base_url=stack.base_url + "/v1", api_key="unused", max_retries=0)


# --- SSE relay ----------------------------------------------------------------------------


def test_sse_utf8_split(oai: openai.OpenAI, stack: Stack):
    text = "안녕하세요 👋"
    stream = oai.chat.completions.create(
        model=MODEL,
        messages=_msgs(),
        stream=True,
        extra_body={"sim_faults": {"chunks": [text], "utf8_split": True, "split_pause_s": 0.05}},
    )
    joined = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert joined == text
    assert "\ufffd" not in joined
    # the engine really cut its writes: the request carried the fault
    assert stack.sim_requests()[-1]["body"]["sim_faults"]["utf8_split"] is True


@pytest.mark.parametrize("encoding", [None, "gzip"])
def test_sse_no_buffering(http: httpx.Client, encoding: str | None):
    faults = {"ttft_delay_s": 0.2, "chunks": ["w"] * 50, "chunk_interval_s": 0.025}
    body = {"model": MODEL, "messages": _msgs(), "stream": True, "sim_faults": faults}
    headers = {"accept-encoding": encoding} if encoding else {}
    arrivals = []
    resp = None
    for t, data, r in stream_events(http, body, headers):
        resp = r
        if data == b"[DONE]":
            continue
        doc = orjson.loads(data)
        if doc["choices"] and doc["choices"][0]["delta"].get("content"):
            arrivals.append(t)
    assert resp is not None
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert resp.headers["cache-control"] == "no-cache"
    assert resp.headers["x-accel-buffering"] == "no"
    assert "content-encoding" not in resp.headers
    assert len(arrivals) == 50
    # first content chunk: the engine sends it at 0.2 s (+ one 25 ms gap); not held back
    assert 0.2 <= arrivals[0] < 0.2 + 0.025 + 0.2
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert 0.015 <= statistics.median(gaps) <= 0.05
    # spread over the whole generation, not delivered in a burst at the end
    assert arrivals[-1] - arrivals[0] >= 49 * 0.025 * 0.8


def test_upstream_reset_midstream(http: httpx.Client, stack: Stack):
    """A reset after content reached the client: resumed on another replica, one stream. The
    continuation regenerates the healed tail (" ", ``heal_tail``), which the splice drops."""
    faults = {"chunks": ["a ", "b ", "c ", "d"], "reset_after_chunks": 3}
    body = {"model": MODEL, "messages": _msgs(), "stream": True, "sim_faults": faults}
    before = metric(stack, "speedgate_resumes_total", reason="broken-stream", outcome="resumed")
    events = [data for _, data, _ in stream_events(http, body)]
    assert events[-1] == b"[DONE]"
    docs = [orjson.loads(d) for d in events[:-1]]
    contents = [c["choices"][0]["delta"].get("content") for c in docs]
    assert contents == ["", "a ", "b ", "c ", "d"]  # one role chunk, nothing repeated
    assert [c["choices"][0]["finish_reason"] for c in docs].count("stop") == 1
    assert len({c["id"] for c in docs}) == 1
    assert wait_for(lambda: metric(stack, "speedgate_resumes_total", reason="broken-stream",
                                   outcome="resumed") == before + 1)


def test_upstream_reset_mid_tool_call_is_an_in_band_error(http: httpx.Client, stack: Stack):
    """A break inside a tool call's arguments cannot be resumed: one in-band error event, no
    ``[DONE]``, no invented finish reason."""
    faults = {"chunks": ["a", "{", '"x"', ": 1}"], "tool_call_after_chunks": 1,
              "reset_after_chunks": 3}
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    body = {"model": MODEL, "messages": _msgs(), "stream": True, "sim_faults": faults,
            "tools": tools}
    before = metric(stack, "speedgate_requests_total", outcome="upstream_error")
    events = [data for _, data, _ in stream_events(http, body)]
    assert b"[DONE]" not in events
    docs = [orjson.loads(d) for d in events]
    *chunks, last = docs
    assert set(last) == {"error"}
    assert set(last["error"]) == {"message", "type", "param", "code"}
    assert last["error"]["code"] == "upstream_error"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks)  # none invented
    assert wait_for(
        lambda: metric(stack, "speedgate_requests_total", outcome="upstream_error") == before + 1
    )
    assert metric(stack, "speedgate_resumes_total", reason="broken-stream", outcome="refused")


def test_upstream_reset_midstream_non_streaming(http: httpx.Client):
    """The JSON answer is assembled from the engine's stream: a reset is resumed too."""
    faults = {"chunks": ["a ", "b ", "c ", "d"], "reset_after_chunks": 3}
    r = http.post(CHAT, json={"model": MODEL, "messages": _msgs(), "sim_faults": faults})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "a b c d"
    # a break that cannot be resumed (n > 1) is a 502 in the API's shape
    r = http.post(CHAT, json={"model": MODEL, "messages": _msgs(), "n": 2,
                              "sim_faults": {"reset_after_chunks": 3}})
    assert r.status_code == 502
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == "upstream_error"


def test_toolcall_incremental(http: httpx.Client):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                    "required": ["city", "days"],
                },
            },
        }
    ]
    body = {
        "model": MODEL,
        "messages": _msgs("weather in Paris?"),
        "tools": tools,
        "stream": True,
        "stream_options": {"include_usage": True},
        "sim_faults": {"tool_args_chunks": 20, "chunk_interval_s": 0.03},
    }
    arg_times, args, ids, indexes, usage_chunks, finish = [], [], set(), set(), 0, None
    for t, data, _ in stream_events(http, body):
        if data == b"[DONE]":
            continue
        doc = orjson.loads(data)
        if not doc["choices"]:
            usage_chunks += 1
            continue
        choice = doc["choices"][0]
        finish = choice["finish_reason"] or finish
        for call in choice["delta"].get("tool_calls") or []:
            indexes.add(call["index"])
            if call.get("id"):
                ids.add(call["id"])
            frag = (call.get("function") or {}).get("arguments")
            if frag:
                arg_times.append(t)
                args.append(frag)
    assert len(args) == 20
    assert indexes == {0} and len(ids) == 1
    parsed = orjson.loads("".join(args))
    assert set(parsed) <= {"city", "days"} and parsed
    assert finish == "tool_calls"
    assert usage_chunks == 1
    # arrived as generated (~30 ms apart), not in one burst at the end
    assert arg_times[-1] - arg_times[0] >= 19 * 0.03 * 0.6


@pytest.mark.parametrize("path", [CHAT, "/v1/completions"])
def test_usage_chunk_shape(http: httpx.Client, stack: Stack, path: str):
    base = {"model": MODEL, "stream": True, "max_tokens": 8}
    base |= {"messages": _msgs()} if path == CHAT else {"prompt": "Once upon a time"}

    def collect(body: dict) -> list[bytes]:
        with http.stream("POST", path, json=body) as r:
            assert r.status_code == 200
            raw = r.read()
        return [e[6:] for e in raw.split(b"\n\n") if e.startswith(b"data: ")]

    events = collect(base | {"stream_options": {"include_usage": True}})
    assert events[-1] == b"[DONE]"
    docs = [orjson.loads(e) for e in events[:-1]]
    usage_docs = [d for d in docs if d["choices"] == []]
    assert len(usage_docs) == 1 and usage_docs[0] is docs[-1]
    usage = usage_docs[0]["usage"]
    assert usage["completion_tokens"] == 8
    assert usage["total_tokens"] == usage["prompt_tokens"] + 8

    events = collect(base)
    assert events[-1] == b"[DONE]"
    docs = [orjson.loads(e) for e in events[:-1]]
    assert all(d["choices"] != [] for d in docs)  # the gateway's own usage chunk is stripped
    assert not any("usage" in d and d["usage"] for d in docs)
    sent = stack.sim_requests()[-1]["body"]
    assert sent["stream_options"] == {"include_usage": True}  # asked for on our behalf


# --- Request bodies -----------------------------------------------------------------------

VALID_SHAPES = {
    "content_and_tool_calls_then_tool": [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ],
    "content_null": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c", "type": "function",
                         "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "ok"},
    ],
    "content_empty": [{"role": "user", "content": ""}],
    "content_parts": [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    ],
    "developer_role": [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ],
}


@pytest.mark.parametrize("shape", sorted(VALID_SHAPES))
def test_body_shapes_forwarded_unchanged(http: httpx.Client, stack: Stack, shape: str):
    body = {
        "model": f"{MODEL}-fast",
        "messages": VALID_SHAPES[shape],
        "max_tokens": 4,
        "top_k": 5,
        "ignore_eos": False,
        "continue_final_message": False,
    }
    r = http.post(CHAT, json=body)
    assert r.status_code == 200, r.text
    assert r.json()["object"] == "chat.completion"
    received = stack.sim_requests()[-1]["body"]
    # only the owned fields changed (a JSON answer is streamed upstream and assembled)
    assert received == body | {"model": MODEL, "stream": True,
                               "stream_options": {"include_usage": True}}


def test_body_shapes_engine_4xx_passes_through_without_retry(http: httpx.Client, stack: Stack):
    faults = {"status": 400, "error_message": "bad tool arguments"}
    body = {"model": f"{MODEL}-fast", "messages": _msgs(), "sim_faults": faults}
    r = http.post(CHAT, json=body)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["message"] == "bad tool arguments"
    assert err["type"] == "invalid_request_error"
    assert len(stack.sim_requests()) == 1  # one attempt, no retry, no fallback to standard


def test_body_shapes_engine_flat_error_shape(http: httpx.Client):
    faults = {"status": 422, "error_message": "flat shape", "error_shape": "flat"}
    r = http.post(CHAT, json={"model": MODEL, "messages": _msgs(), "sim_faults": faults})
    assert r.status_code == 422
    assert r.json()["error"]["message"] == "flat shape"


@pytest.mark.parametrize(
    ("content", "headers", "status", "code"),
    [
        (b'{"model": "mymodel", "messages": [', {"content-type": "application/json"}, 400,
         "invalid_json"),
        (b'{"model":"mymodel","messages":[{"role":"user","content":"x"}]}',
         {"content-type": "text/plain"}, 415, "unsupported_media_type"),
        (b"", {"content-type": "application/json"}, 400, "invalid_json"),
        (b'{"model":"nope","messages":[{"role":"user","content":"x"}]}',
         {"content-type": "application/json"}, 404, "model_not_found"),
    ],
)
def test_body_shapes_gateway_errors(http: httpx.Client, content, headers, status, code):
    r = http.post(CHAT, content=content, headers=headers)
    assert r.status_code == status
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == code
    assert r.headers["x-request-id"]


def test_body_shapes_over_limit_is_413(http: httpx.Client, stack: Stack):
    big = "x" * (9 * 1024 * 1024)  # the stack's limit is 8 MiB
    r = http.post(CHAT, json={"model": MODEL, "messages": _msgs(big)})
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"
    assert stack.sim_requests() == []


def test_large_conversation_is_accepted(http: httpx.Client, stack: Stack):
    # ~5 MiB, the size of a long agent session's conversation
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": "word " * 1000}
            for i in range(1000)]
    r = http.post(CHAT, json={"model": MODEL, "messages": msgs, "max_tokens": 2})
    assert r.status_code == 200, r.text[:300]
    assert stack.sim_requests()[-1]["body"]["messages"] == msgs


# --- Client disconnect --------------------------------------------------------------------


def _assert_aborted_and_released(stack: Stack, status_before: float):
    assert wait_for(lambda: stack.sim_stats()["aborted"] == 1, timeout_s=2.0), stack.sim_stats()
    assert wait_for(lambda: metric(stack, "speedgate_replica_inflight") == 0, timeout_s=2.0)
    assert wait_for(
        lambda: metric(stack, "speedgate_requests_total", status="499") == status_before + 1
    )


def test_disconnect_aborts_non_streaming(stack: Stack):
    before = metric(stack, "speedgate_requests_total", status="499")
    body = {"model": MODEL, "messages": _msgs(), "max_tokens": 4000,
            "sim_faults": {"ttft_delay_s": 30}}
    t0 = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(stack.base_url + CHAT, json=body, timeout=httpx.Timeout(30, read=1.0))
    _assert_aborted_and_released(stack, before)
    assert time.monotonic() - t0 < 4


def test_disconnect_aborts_streaming_before_first_token(stack: Stack):
    before = metric(stack, "speedgate_requests_total", status="499")
    body = {"model": MODEL, "messages": _msgs(), "stream": True,
            "sim_faults": {"ttft_delay_s": 30}}
    with pytest.raises(httpx.ReadTimeout), httpx.stream(
        "POST", stack.base_url + CHAT, json=body, timeout=httpx.Timeout(30, read=1.0)
    ) as r:
        r.read()
    _assert_aborted_and_released(stack, before)


def test_disconnect_aborts_streaming_after_first_token(stack: Stack):
    before = metric(stack, "speedgate_requests_total", status="499")
    body = {"model": MODEL, "messages": _msgs(), "stream": True,
            "sim_faults": {"chunks": ["x"] * 100, "chunk_interval_s": 0.5}}
    with httpx.stream("POST", stack.base_url + CHAT, json=body, timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if '"content":"x"' in line:
                break  # got the first token: close the connection now
    _assert_aborted_and_released(stack, before)
    assert stack.sim_stats()["completed"] == 0


def test_malformed_chunk_mid_stream_is_resumed(http: httpx.Client):
    faults = {"chunks": ["a ", "b ", "c"], "malformed_after_chunks": 2}
    body = {"model": MODEL, "messages": _msgs(), "stream": True, "sim_faults": faults}
    events = [data for _, data, _ in stream_events(http, body)]
    assert events[-1] == b"[DONE]"
    docs = [orjson.loads(e) for e in events[:-1]]  # every event the client sees is valid JSON
    assert [d["choices"][0]["delta"].get("content") for d in docs] == ["", "a ", "b ", "c"]


def test_health_head_and_model_retrieve(oai: openai.OpenAI, stack: Stack):
    assert httpx.head(stack.base_url + "/healthz").status_code == 200
    m = oai.models.retrieve(f"{MODEL}-fast")
    assert m.id == f"{MODEL}-fast"
    with pytest.raises(openai.NotFoundError):
        oai.models.retrieve("nope")
