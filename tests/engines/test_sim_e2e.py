"""End-to-end: the simulator as a real subprocess, driven by the openai client and raw HTTP."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import orjson
import pytest

from engines.sim.testing import SimProcess, start_sim

pytestmark = pytest.mark.e2e
MSGS = [{"role": "user", "content": "Say something."}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"]}}}]


@pytest.fixture(scope="module")
def sim():
    with start_sim(time_scale=0, model="m") as s:
        yield s


@pytest.fixture(scope="module")
def slow_sim():
    with start_sim(time_scale=1, model="m") as s:
        yield s


@pytest.fixture
def client(sim: SimProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=sim.base_url, api_key="x", max_retries=0)


def events(raw: bytes) -> list[str]:
    """The ``data:`` payloads of an SSE body (multi-line data joined with newlines)."""
    out = []
    for block in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        lines = [ln[5:].lstrip(b" ") for ln in block.split(b"\n") if ln.startswith(b"data:")]
        if lines:
            out.append(b"\n".join(lines).decode())
    return out


def post_stream(sim: SimProcess, body: dict, path: str = "/v1/chat/completions") -> bytes:
    body = {"model": "m", "stream": True, **body}
    with httpx.stream("POST", sim.url + path, json=body, timeout=10) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        return r.read()


def test_chat_non_stream_and_stream_agree(client: openai.OpenAI) -> None:
    full = client.chat.completions.create(model="m", messages=MSGS, max_tokens=10)
    assert full.choices[0].finish_reason == "length"
    assert full.usage.completion_tokens == 10
    assert full.usage.prompt_tokens_details.cached_tokens is not None
    chunks = list(client.chat.completions.create(model="m", messages=MSGS, max_tokens=10,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == "length"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == full.choices[0].message.content and text


def test_n_and_stop(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="m", messages=MSGS, n=2, max_tokens=20)
    assert [c.index for c in r.choices] == [0, 1]
    assert r.choices[0].message.content != r.choices[1].message.content
    word = r.choices[0].message.content.split()[3]
    s = client.chat.completions.create(model="m", messages=MSGS, max_tokens=20, stop=[word])
    assert s.choices[0].finish_reason == "stop"
    assert word not in s.choices[0].message.content
    assert r.choices[0].message.content.startswith(s.choices[0].message.content)


def test_tool_call_streams_argument_deltas(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(
        model="m", messages=MSGS, tools=TOOLS, stream=True,
        extra_body={"sim_faults": {"tool_args_chunks": 6}}))
    calls = [c.choices[0].delta.tool_calls[0] for c in chunks
             if c.choices and c.choices[0].delta.tool_calls]
    assert calls[0].id.startswith("chatcmpl-tool-") and calls[0].function.name == "get_weather"
    assert len(calls) == 7 and all(c.index == 0 for c in calls)
    args = orjson.loads("".join(c.function.arguments or "" for c in calls))
    assert set(args) == {"city", "days"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    full = client.chat.completions.create(model="m", messages=MSGS, tools=TOOLS)
    assert full.choices[0].message.content is None
    assert orjson.loads(full.choices[0].message.tool_calls[0].function.arguments) == args


def test_cached_tokens_on_repeated_long_prompt(client: openai.OpenAI) -> None:
    long = [{"role": "user", "content": " ".join(f"w{i}" for i in range(1000))}]
    first = client.chat.completions.create(model="m", messages=long, max_tokens=4)
    second = client.chat.completions.create(model="m", messages=long, max_tokens=4)
    assert first.usage.prompt_tokens > 1000
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens - 16 <= cached < first.usage.prompt_tokens


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_include_usage_final_chunk(sim: SimProcess, path: str) -> None:
    body = {"max_tokens": 5, "stream_options": {"include_usage": True}}
    body.update({"messages": MSGS} if "chat" in path else {"prompt": "Once upon"})
    evs = events(post_stream(sim, body, path))
    assert evs[-1] == "[DONE]"
    last = orjson.loads(evs[-2])
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 5
    assert all("usage" not in orjson.loads(e) for e in evs[:-2])
    no_usage = events(post_stream(sim, {**body, "stream_options": None}, path))
    assert all(orjson.loads(e)["choices"] for e in no_usage[:-1])


def test_utf8_split_cuts_bytes(sim: SimProcess) -> None:
    text = "안녕하세요 👋"
    body = {"model": "m", "messages": MSGS, "stream": True,
            "sim_faults": {"chunks": [text], "utf8_split": True, "split_pause_s": 0.02}}
    pieces = []
    with httpx.stream("POST", sim.url + "/v1/chat/completions", json=body) as r:
        pieces = list(r.iter_raw())
    assert len(pieces) >= 6
    bad = 0
    for p in pieces:
        try:
            p.decode()
        except UnicodeDecodeError:
            bad += 1
    assert bad >= 2
    evs = events(b"".join(pieces))
    content = "".join(orjson.loads(e)["choices"][0]["delta"].get("content", "")
                      for e in evs[:-1])
    assert content == text


def test_reset_after_chunks_leaves_incomplete_response(sim: SimProcess) -> None:
    body = {"model": "m", "messages": MSGS, "stream": True,
            "sim_faults": {"reset_after_chunks": 3}}
    got = b""
    with pytest.raises(httpx.RemoteProtocolError):
        with httpx.stream("POST", sim.url + "/v1/chat/completions", json=body) as r:
            for part in r.iter_raw():
                got += part
    evs = events(got)
    assert len(evs) == 4 and "[DONE]" not in evs
    assert all(orjson.loads(e)["choices"][0]["finish_reason"] is None for e in evs)
    with pytest.raises(httpx.TransportError):
        httpx.post(sim.url + "/v1/chat/completions",
                   json={"model": "m", "messages": MSGS, "sim_faults": {"reset_after_chunks": 0}})


def test_status_and_retry_after(sim: SimProcess) -> None:
    r = httpx.post(sim.url + "/v1/chat/completions", json={
        "model": "m", "messages": MSGS,
        "sim_faults": {"status": 429, "retry_after": 2, "error_message": "slow down"}})
    assert r.status_code == 429 and r.headers["retry-after"] == "2"
    assert r.json() == {"error": {"message": "slow down", "type": "RateLimitError",
                                  "param": None, "code": 429}}
    flat = httpx.post(sim.url + "/v1/chat/completions", json={
        "model": "m", "messages": MSGS, "sim_faults": {"status": 503, "error_shape": "flat"}})
    assert flat.status_code == 503 and flat.json()["object"] == "error"


def test_errors_like_vllm(sim: SimProcess) -> None:
    r = httpx.post(sim.url + "/v1/chat/completions", json={"model": "nope", "messages": MSGS})
    assert r.status_code == 404
    assert r.json()["error"]["message"].startswith("The model `nope` does not exist.")
    r = httpx.post(sim.url + "/v1/chat/completions",
                   json={"model": "m", "messages": MSGS, "max_tokens": 10**6})
    assert r.status_code == 400 and r.json()["error"]["type"] == "BadRequestError"
    r = httpx.post(sim.url + "/v1/chat/completions", content=b"{nope",
                   headers={"content-type": "application/json"})
    assert r.status_code == 400


def test_framing_faults(sim: SimProcess) -> None:
    raw = post_stream(sim, {"messages": MSGS, "max_tokens": 3, "sim_faults": {
        "comments": True, "crlf": True, "multiline_data": True, "malformed_after_chunks": 1}})
    assert b": keepalive\r\n\r\n" in raw and b"\r\ndata: " in raw
    evs = events(raw)
    assert '{"id": broken' in evs
    good = [orjson.loads(e) for e in evs if e not in ('{"id": broken', "[DONE]")]
    assert len(good) == 4 and evs[-1] == "[DONE]"


async def test_ttft_delay_after_headers_and_chunk_interval(sim: SimProcess) -> None:
    """``ttft_delay_s`` runs after the status and headers, before the first event;
    ``chunk_interval_s`` spaces the events. Shown by what cannot happen under CPU contention,
    never by an upper bound on elapsed time: (1) with a delay far longer than the client waits,
    the headers still arrive (they could not, were the delay before them) and no event follows
    within a second (one would at once, were the delay not applied); (2) three events 0.25 s
    apart take at least 0.5 s from the request's start (sleeps only lengthen under load)."""
    async with httpx.AsyncClient(base_url=sim.url, timeout=30) as c:
        before = (await c.get("/sim/stats")).json()["aborted"]
        body = {"model": "m", "messages": MSGS, "stream": True,
                "sim_faults": {"ttft_delay_s": 3600, "chunks": ["a"]}}
        async with c.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            first = r.aiter_raw().__anext__()
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(first, timeout=1.0)
        # the client hung up during the delay: the simulator aborts the request
        for _ in range(600):  # polled up to 30 s: a loaded machine notices late, never wrongly
            stats = (await c.get("/sim/stats")).json()
            if stats["aborted"] > before:
                break
            await asyncio.sleep(0.05)
        assert stats["aborted"] == before + 1 and stats["running"] == 0
        body = {"model": "m", "messages": MSGS, "stream": True,
                "sim_faults": {"chunks": ["a", "b", "c"], "chunk_interval_s": 0.25}}
        t0 = time.monotonic()
        raw = (await c.post("/v1/chat/completions", json=body)).content
        assert time.monotonic() - t0 >= 2 * 0.25
    content = [orjson.loads(e)["choices"][0]["delta"].get("content") for e in events(raw)[1:-1]]
    assert content == ["a", "b", "c"]


async def test_abort_counted_on_disconnect(slow_sim: SimProcess) -> None:
    async with httpx.AsyncClient(base_url=slow_sim.url) as c:
        before = (await c.get("/sim/stats")).json()["aborted"]
        with pytest.raises(httpx.ReadTimeout):
            await c.post("/v1/chat/completions", timeout=0.5, json={
                "model": "m", "messages": MSGS, "max_tokens": 4000, "ignore_eos": True})
        for _ in range(40):
            stats = (await c.get("/sim/stats")).json()
            if stats["aborted"] > before:
                break
            await asyncio.sleep(0.05)
        assert stats["aborted"] == before + 1 and stats["running"] == 0
        log = (await c.get("/sim/requests")).json()
        assert log[-1]["aborted"] and not log[-1]["completed"]
        metrics = (await c.get("/metrics")).text
        assert 'sim_aborted_requests_total{model_name="m"} 1.0' in metrics


def test_request_log_and_metrics(sim: SimProcess) -> None:
    httpx.post(sim.url + "/v1/chat/completions", headers={"X-Request-Id": "abc"},
               json={"model": "m", "messages": MSGS, "top_k": 5, "max_tokens": 2})
    entry = httpx.get(sim.url + "/sim/requests").json()[-1]
    assert entry["headers"]["x-request-id"] == "abc" and entry["body"]["top_k"] == 5
    assert entry["completed"] and entry["path"] == "/v1/chat/completions"
    text = httpx.get(sim.url + "/metrics").text
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total",
                 "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:request_success_total",
                 "sim_requests_total"):
        assert name + "{" in text
    models = httpx.get(sim.url + "/v1/models").json()
    assert models["data"][0]["owned_by"] == "vllm" and models["data"][0]["id"] == "m"


def test_replica_faults_endpoint(sim: SimProcess) -> None:
    r = httpx.post(sim.url + "/sim/faults", json={"status": 503, "retry_after": 1})
    assert r.status_code == 200
    try:
        assert httpx.post(sim.url + "/v1/completions",
                          json={"model": "m", "prompt": "x"}).status_code == 503
        ok = httpx.post(sim.url + "/v1/completions",
                        json={"model": "m", "prompt": "x", "sim_faults": {"status": None}})
        assert ok.status_code == 200
    finally:
        httpx.delete(sim.url + "/sim/faults")
    assert httpx.post(sim.url + "/v1/completions",
                      json={"model": "m", "prompt": "x"}).status_code == 200


def test_speculative_mode_counts_drafts() -> None:
    with start_sim(time_scale=0, mode="speculative", num_speculative_tokens=3) as s:
        r = httpx.post(s.url + "/v1/completions",
                       json={"prompt": "hi", "max_tokens": 50, "ignore_eos": True})
        assert r.json()["usage"]["completion_tokens"] == 50
        text = httpx.get(s.url + "/metrics").text
        assert "vllm:spec_decode_num_accepted_tokens_total{" in text
        assert "vllm:spec_decode_num_drafts_total{" in text


def test_slow_start_then_crash() -> None:
    with start_sim(time_scale=0, slow_start_s=0.6, wait_ready=False) as s:
        assert httpx.get(s.url + "/health").status_code == 503
        time.sleep(0.7)
        assert httpx.get(s.url + "/health").status_code == 200
        httpx.post(s.url + "/sim/faults", json={"crash": True})
        with pytest.raises(httpx.TransportError):
            httpx.post(s.url + "/v1/completions", json={"prompt": "x"})
        s.proc.wait(5)
        assert not s.alive()
