"""The official ``openai`` client against a real stack (2 simulator replicas per tier + gateway).

What the client sees (content, usage, finish reasons, tool calls, service tier, errors, headers)
and what the engines received (``/sim/requests``: path, headers, body) for the same request.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai import AsyncOpenAI, OpenAI

from tests.e2e.stack import MODEL, Stack

pytestmark = pytest.mark.e2e

MESSAGES = [{"role": "user", "content": "Say something about gateways."}]
CHUNKS = ["Hel", "lo", ", wör", "ld 🌍", "!"]
CHUNKS_TEXT = "".join(CHUNKS)
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather forecast for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer"},
            },
            "required": ["city", "unit", "days"],
        },
    },
}
SERVICE_TIER = {"fast": "priority", "standard": "default"}
BLOCK_SIZE = 16  # the simulator's KV block size (tokens)


# --- helpers -------------------------------------------------------------------------------


@pytest.fixture
def client(stack: Stack) -> Iterator[OpenAI]:
    with OpenAI(base_url=stack.base_url + "/v1", api_key="unused", max_retries=0,
                timeout=30) as c:
        yield c


def async_client(stack: Stack) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=stack.base_url + "/v1", api_key="unused", max_retries=0,
                       timeout=30)


def hget(headers: dict[str, str], name: str) -> str | None:
    """Case-insensitive lookup in a header dict as ``/sim/requests`` reports it."""
    name = name.lower()
    for k, v in headers.items():
        if k.lower() == name:
            return v
    return None


def replica_log(url: str) -> list[dict[str, Any]]:
    """``/sim/requests`` of one replica, oldest first."""
    return httpx.get(url + "/sim/requests", timeout=5).json()


def engine_requests(stack: Stack) -> dict[str, list[dict[str, Any]]]:
    """Completions requests received, per tier (control-plane paths excluded)."""
    return {
        tier: [
            r for u in urls for r in replica_log(u) if r["path"].startswith("/v1/")
        ]
        for tier, urls in stack.sims.items()
    }


def only_engine_request(stack: Stack, tier: str) -> dict[str, Any]:
    """The single request the engines received; asserts it went to ``tier`` and only there."""
    got = engine_requests(stack)
    other = "standard" if tier == "fast" else "fast"
    assert len(got[tier]) == 1, got
    assert got[other] == [], got
    return got[tier][0]


def replica_of(stack: Stack, request_id: str) -> str:
    """URL of the replica whose request log holds ``request_id`` (exactly one must)."""
    hits = [
        u for u in stack.all_sims()
        for r in replica_log(u) if hget(r["headers"], "x-request-id") == request_id
    ]
    assert len(hits) == 1, (request_id, hits)
    return hits[0]


def assert_openai_error(resp: httpx.Response, status: int, param: str | None) -> dict:
    assert resp.status_code == status
    assert resp.headers.get("x-request-id")
    doc = resp.json()
    assert set(doc) == {"error"}
    err = doc["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param
    return err


def expected_cached(prompt_tokens: int) -> int:
    """Cached tokens of a full prefix hit: every full block, but the last prompt token is always
    recomputed (a prompt that is a whole number of blocks loses its last block)."""
    return (prompt_tokens - 1) // BLOCK_SIZE * BLOCK_SIZE


# --- non-streaming chat --------------------------------------------------------------------


def test_chat_non_stream(stack: Stack, client: OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=16
    )
    resp = raw.parse()
    assert raw.status_code == 200
    assert resp.object == "chat.completion"
    assert resp.model == "mymodel"
    assert resp.service_tier == "default"
    assert len(resp.choices) == 1
    choice = resp.choices[0]
    assert choice.index == 0
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content.strip()
    assert choice.finish_reason == "length"  # max_tokens 16 < the simulator's natural 64
    assert resp.usage is not None
    assert resp.usage.prompt_tokens > 0
    assert resp.usage.completion_tokens == 16
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + 16
    assert raw.headers["x-speedgate-tier"] == "standard"
    assert "x-speedgate-fallback" not in raw.headers
    rid = raw.headers["x-request-id"]
    assert rid

    seen = only_engine_request(stack, "standard")
    assert seen["path"] == "/v1/chat/completions"
    assert hget(seen["headers"], "x-request-id") == rid
    assert seen["body"]["model"] == "mymodel"
    assert seen["body"]["messages"] == MESSAGES
    # non-stream: streamed upstream with usage, the JSON assembled by the gateway
    assert seen["body"]["stream"] is True
    assert seen["body"]["stream_options"] == {"include_usage": True}


def test_client_request_id_is_propagated(stack: Stack, client: OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=4,
        extra_headers={"x-request-id": "client-rid-42"},
    )
    raw.parse()
    assert raw.headers["x-request-id"] == "client-rid-42"
    seen = only_engine_request(stack, "standard")
    assert hget(seen["headers"], "x-request-id") == "client-rid-42"


# --- streaming chat ------------------------------------------------------------------------


def check_chat_stream(chunks: list[Any], text: str, finish: str) -> None:
    """One choice; role chunk first; joined deltas == ``text``; finish only on the last
    chunk; no usage anywhere; every chunk carries model and service tier."""
    assert chunks
    for c in chunks:
        assert c.object == "chat.completion.chunk"
        assert c.model == "mymodel"
        assert c.service_tier == "default"
        assert c.usage is None
        assert len(c.choices) == 1 and c.choices[0].index == 0
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    finishes = [c.choices[0].finish_reason for c in chunks]
    assert finishes == [None] * (len(chunks) - 1) + [finish]
    assert len({c.id for c in chunks}) == 1


def check_engine_asked_usage(stack: Stack, sent_messages: list[dict]) -> None:
    seen = only_engine_request(stack, "standard")
    body = seen["body"]
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["model"] == "mymodel"
    assert body["messages"] == sent_messages


def test_chat_stream_sync(stack: Stack, client: OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, stream=True,
        extra_body={"sim_faults": {"chunks": CHUNKS}},
    )
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert raw.headers["x-speedgate-tier"] == "standard"
    assert raw.headers["x-request-id"]
    chunks = list(raw.parse())
    check_chat_stream(chunks, CHUNKS_TEXT, "stop")
    assert len(chunks) == 1 + len(CHUNKS)  # role chunk + one per scripted delta
    check_engine_asked_usage(stack, MESSAGES)


def test_chat_stream_sync_generated_text(stack: Stack, client: OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, stream=True, max_tokens=8
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text.strip()
    check_chat_stream(chunks, text, "length")
    check_engine_asked_usage(stack, MESSAGES)


async def test_chat_stream_async(stack: Stack) -> None:
    async with async_client(stack) as ac:
        stream = await ac.chat.completions.create(
            model=MODEL, messages=MESSAGES, stream=True,
            extra_body={"sim_faults": {"chunks": CHUNKS}},
        )
        chunks = [c async for c in stream]
    check_chat_stream(chunks, CHUNKS_TEXT, "stop")
    check_engine_asked_usage(stack, MESSAGES)


async def test_chat_streams_async_concurrent(stack: Stack) -> None:
    """Concurrent streams each get their own text (no cross-talk between relays)."""
    scripts = [[f"s{i}-", "a", "b", f"-{i}"] for i in range(6)]

    async def one(ac: AsyncOpenAI, script: list[str]) -> str:
        stream = await ac.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "".join(script)}], stream=True,
            extra_body={"sim_faults": {"chunks": script, "chunk_interval_s": 0.01}},
        )
        chunks = [c async for c in stream]
        check_chat_stream(chunks, "".join(script), "stop")
        return "".join(c.choices[0].delta.content or "" for c in chunks)

    async with async_client(stack) as ac:
        texts = await asyncio.gather(*(one(ac, s) for s in scripts))
    assert texts == ["".join(s) for s in scripts]
    got = engine_requests(stack)
    assert len(got["standard"]) == len(scripts) and got["fast"] == []


def test_chat_stream_client_stream_options_without_usage(stack: Stack, client: OpenAI) -> None:
    """``include_usage: false`` from the client: the engine is still asked for usage (the
    gateway merges it in) and the client gets no usage chunk."""
    stream = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, stream=True, stream_options={"include_usage": False},
        extra_body={"sim_faults": {"chunks": CHUNKS}},
    )
    chunks = list(stream)
    check_chat_stream(chunks, CHUNKS_TEXT, "stop")
    check_engine_asked_usage(stack, MESSAGES)


def test_chat_stream_raw_sse_framing(stack: Stack) -> None:
    """On the wire: ``data: {json}`` events, no usage event, ``data: [DONE]`` last."""
    body = {"model": MODEL, "messages": MESSAGES, "stream": True,
            "sim_faults": {"chunks": CHUNKS}}
    with httpx.stream("POST", stack.base_url + "/v1/chat/completions", json=body,
                      timeout=30) as r:
        assert r.status_code == 200
        raw = r.read().decode()
    assert raw.endswith("data: [DONE]\n\n")
    events = [e for e in raw.split("\n\n") if e and not e.startswith(":")]
    assert all(e.startswith("data: ") for e in events)
    docs = [json.loads(e[6:]) for e in events[:-1]]
    assert len(docs) == 1 + len(CHUNKS)
    assert all("usage" not in d for d in docs)
    assert all(d["choices"] for d in docs)


# --- /v1/completions -----------------------------------------------------------------------


def test_completions_non_stream(stack: Stack, client: OpenAI) -> None:
    raw = client.completions.with_raw_response.create(
        model=MODEL, prompt="Once upon a time", max_tokens=8
    )
    resp = raw.parse()
    assert raw.headers["x-speedgate-tier"] == "standard"
    assert resp.object == "text_completion"
    assert resp.model == "mymodel"
    assert len(resp.choices) == 1
    assert resp.choices[0].index == 0
    assert resp.choices[0].text.strip()
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage is not None
    assert resp.usage.prompt_tokens > 0 and resp.usage.completion_tokens == 8
    seen = only_engine_request(stack, "standard")
    assert seen["path"] == "/v1/completions"
    assert seen["body"]["prompt"] == "Once upon a time"
    assert seen["body"]["model"] == "mymodel"


def test_completions_stream(stack: Stack, client: OpenAI) -> None:
    raw = client.completions.with_raw_response.create(
        model=MODEL, prompt="Once upon a time", stream=True,
        extra_body={"sim_faults": {"chunks": CHUNKS}},
    )
    assert raw.headers["x-speedgate-tier"] == "standard"
    chunks = list(raw.parse())
    assert len(chunks) == len(CHUNKS)
    for c in chunks:
        assert c.object == "text_completion"
        assert c.model == "mymodel"
        assert c.usage is None
        assert len(c.choices) == 1 and c.choices[0].index == 0
    assert "".join(c.choices[0].text for c in chunks) == CHUNKS_TEXT
    finishes = [c.choices[0].finish_reason for c in chunks]
    assert finishes == [None] * (len(chunks) - 1) + ["stop"]
    seen = only_engine_request(stack, "standard")
    assert seen["path"] == "/v1/completions"
    assert seen["body"]["stream_options"] == {"include_usage": True}
    assert seen["body"]["prompt"] == "Once upon a time"


# --- n = 2 ---------------------------------------------------------------------------------


def test_n2_non_stream(stack: Stack, client: OpenAI) -> None:
    resp = client.chat.completions.create(model=MODEL, messages=MESSAGES, n=2, max_tokens=8)
    assert [c.index for c in resp.choices] == [0, 1]
    texts = [c.message.content for c in resp.choices]
    assert all(t and t.strip() for t in texts)
    assert texts[0] != texts[1]  # each choice generates its own text
    assert [c.finish_reason for c in resp.choices] == ["length", "length"]
    assert resp.usage is not None and resp.usage.completion_tokens == 16
    assert only_engine_request(stack, "standard")["body"]["n"] == 2


def test_n2_stream(stack: Stack, client: OpenAI) -> None:
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=MESSAGES, n=2, max_tokens=8, stream=True
    ))
    by_index: dict[int, list[Any]] = {}
    for c in chunks:
        assert c.usage is None
        for ch in c.choices:
            by_index.setdefault(ch.index, []).append(ch)
    assert sorted(by_index) == [0, 1]
    texts = []
    for choices in by_index.values():
        assert choices[0].delta.role == "assistant"
        finishes = [ch.finish_reason for ch in choices]
        assert finishes == [None] * (len(choices) - 1) + ["length"]
        texts.append("".join(ch.delta.content or "" for ch in choices))
    assert all(t.strip() for t in texts)
    assert texts[0] != texts[1]
    assert only_engine_request(stack, "standard")["body"]["n"] == 2


# --- tools ---------------------------------------------------------------------------------


def check_weather_args(arguments: str) -> None:
    args = json.loads(arguments)
    assert set(args) == {"city", "unit", "days"}
    assert isinstance(args["city"], str) and args["city"]
    assert args["unit"] == "celsius"
    assert isinstance(args["days"], int)


def test_tool_call_stream(stack: Stack, client: OpenAI) -> None:
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER_TOOL], stream=True,
    ))
    calls = [
        c.choices[0].delta.tool_calls[0]
        for c in chunks if c.choices and c.choices[0].delta.tool_calls
    ]
    assert len(calls) >= 3  # header + at least two argument fragments
    head, rest = calls[0], calls[1:]
    assert head.index == 0
    assert head.id and head.id.startswith("chatcmpl-tool-")
    assert head.type == "function"
    assert head.function is not None and head.function.name == "get_weather"
    fragments = [(head.function.arguments or "")]
    for tc in rest:
        assert tc.index == 0
        assert tc.id is None
        assert tc.function is not None and tc.function.name is None
        assert tc.function.arguments
        fragments.append(tc.function.arguments)
    check_weather_args("".join(fragments))
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "tool_calls"
    assert all(f is None for f in finishes[:-1])
    assert all(c.usage is None for c in chunks)
    body = only_engine_request(stack, "standard")["body"]
    assert body["tools"] == [WEATHER_TOOL]


def test_tool_call_non_stream(stack: Stack, client: OpenAI) -> None:
    resp = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER_TOOL], tool_choice="auto",
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1
    assert calls[0].id.startswith("chatcmpl-tool-")
    assert calls[0].type == "function"
    assert calls[0].function.name == "get_weather"
    check_weather_args(calls[0].function.arguments)
    body = only_engine_request(stack, "standard")["body"]
    assert body["tools"] == [WEATHER_TOOL] and body["tool_choice"] == "auto"


# --- tier selection ------------------------------------------------------------------------


TIER_CASES = [
    pytest.param({}, "standard", id="default"),
    pytest.param({"service_tier": "priority"}, "fast", id="service_tier-priority"),
    pytest.param({"service_tier": "default"}, "standard", id="service_tier-default"),
    pytest.param({"service_tier": "flex"}, "standard", id="service_tier-flex"),
    pytest.param({"model": "mymodel-fast"}, "fast", id="alias-fast"),
    pytest.param({"extra_headers": {"x-speedgate-tier": "fast"}}, "fast", id="header-fast"),
    pytest.param({"extra_headers": {"x-speedgate-tier": "standard"}, "service_tier": "priority"},
                 "standard", id="header-beats-service_tier"),
    pytest.param({"extra_headers": {"x-speedgate-tier": "standard"}, "model": "mymodel-fast"},
                 "standard", id="header-beats-alias"),
    pytest.param({"model": "mymodel-fast", "service_tier": "default"}, "fast",
                 id="alias-beats-service_tier"),
]


@pytest.mark.parametrize(("kwargs", "tier"), TIER_CASES)
def test_tier_selection(stack: Stack, client: OpenAI, kwargs: dict, tier: str) -> None:
    args = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4, **kwargs}
    raw = client.chat.completions.with_raw_response.create(**args)
    resp = raw.parse()
    assert raw.headers["x-speedgate-tier"] == tier
    assert "x-speedgate-fallback" not in raw.headers
    # a flex request is answered as flex (OpenAI's vocabulary), served standard
    flex = kwargs.get("service_tier") == "flex"
    assert resp.service_tier == ("flex" if flex else SERVICE_TIER[tier])
    seen = only_engine_request(stack, tier)
    assert seen["body"]["model"] == "mymodel"
    assert hget(seen["headers"], "x-request-id") == raw.headers["x-request-id"]


def test_tier_fast_stream(stack: Stack, client: OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, service_tier="priority", stream=True,
        extra_body={"sim_faults": {"chunks": CHUNKS}},
    )
    assert raw.headers["x-speedgate-tier"] == "fast"
    chunks = list(raw.parse())
    assert [c.service_tier for c in chunks] == ["priority"] * len(chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == CHUNKS_TEXT
    seen = only_engine_request(stack, "fast")
    assert seen["body"]["service_tier"] == "priority"  # forwarded untouched


def test_tier_auto_alias(stack: Stack, client: OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="mymodel-auto", messages=MESSAGES, max_tokens=4
    )
    resp = raw.parse()
    tier = raw.headers["x-speedgate-tier"]
    assert tier in SERVICE_TIER
    assert resp.service_tier == SERVICE_TIER[tier]
    assert raw.headers.get("x-speedgate-auto-reason")
    assert only_engine_request(stack, tier)["body"]["model"] == "mymodel"


def test_invalid_service_tier(stack: Stack, client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(
            model=MODEL, messages=MESSAGES,
            service_tier="turbo",  # type: ignore[arg-type]
        )
    e = ei.value
    assert e.status_code == 400
    assert e.param == "service_tier"
    assert e.type == "invalid_request_error"
    assert_openai_error(e.response, 400, "service_tier")
    assert engine_requests(stack) == {"standard": [], "fast": []}


def test_invalid_tier_header(stack: Stack, client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(
            model=MODEL, messages=MESSAGES, extra_headers={"x-speedgate-tier": "warp"}
        )
    assert_openai_error(ei.value.response, 400, "x-speedgate-tier")
    assert engine_requests(stack) == {"standard": [], "fast": []}


@pytest.mark.parametrize("stream", [False, True])
def test_unknown_model(stack: Stack, client: OpenAI, stream: bool) -> None:
    with pytest.raises(openai.NotFoundError) as ei:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES, stream=stream)
    e = ei.value
    assert e.status_code == 404
    assert e.code == "model_not_found"
    err = assert_openai_error(e.response, 404, "model")
    assert err["code"] == "model_not_found"
    assert "no-such-model" in err["message"]
    assert engine_requests(stack) == {"standard": [], "fast": []}


# --- body rewrite and pass-through ---------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_model_rewritten_and_unknown_fields_pass_through(
    stack: Stack, client: OpenAI, stream: bool
) -> None:
    resp = client.chat.completions.create(
        model="mymodel-fast", messages=MESSAGES, max_tokens=4, stream=stream,
        extra_body={"top_k": 5, "ignore_eos": False},
    )
    if stream:
        tiers = [c.service_tier for c in resp]
        assert len(tiers) >= 2 and set(tiers) == {"priority"}
    else:
        assert resp.service_tier == "priority"
    body = only_engine_request(stack, "fast")["body"]
    expected = {  # what the client sent, model rewritten; a JSON answer is streamed upstream
        "model": "mymodel", "messages": MESSAGES, "max_tokens": 4, "stream": True,
        "top_k": 5, "ignore_eos": False, "stream_options": {"include_usage": True},
    }
    assert body == expected


def test_nested_model_key_untouched(stack: Stack, client: OpenAI) -> None:
    """A second ``"model"`` key deeper in the body is not the one rewritten."""
    client.chat.completions.create(
        model="mymodel-fast", messages=MESSAGES, max_tokens=4,
        extra_body={"vllm_xargs": {"model": "mymodel-fast", "x": [1, 2]}},
    )
    body = only_engine_request(stack, "fast")["body"]
    assert body["model"] == "mymodel"
    assert body["vllm_xargs"] == {"model": "mymodel-fast", "x": [1, 2]}


# --- usage with cached tokens --------------------------------------------------------------


def long_conversation() -> list[dict[str, str]]:
    words = " ".join(f"w{i}" for i in range(1500))
    return [
        {"role": "system", "content": "You are a careful assistant."},
        {"role": "user", "content": f"Summarise this: {words}"},
    ]


@pytest.mark.parametrize("stream", [False, True])
def test_usage_cached_tokens(stack: Stack, client: OpenAI, stream: bool) -> None:
    """The same ~1500-token conversation 4x on the standard pool: the first request on a
    replica has no cached tokens, every later one on the same replica hits the prefix cache.
    With 2 replicas at least one of requests 2..4 lands on a replica that already saw it."""
    messages = long_conversation()
    kwargs: dict[str, Any] = {}
    if stream:
        kwargs = {"stream": True, "stream_options": {"include_usage": True}}
    seen_replicas: set[str] = set()
    hits = 0
    prompt_sizes = set()
    for _ in range(4):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, max_tokens=4,
            extra_headers={"x-speedgate-tier": "standard"}, **kwargs,
        )
        assert raw.headers["x-speedgate-tier"] == "standard"
        if stream:
            chunks = list(raw.parse())
            usage_chunks = [c for c in chunks if c.usage is not None]
            assert len(usage_chunks) == 1
            assert usage_chunks[0] is chunks[-1]
            assert chunks[-1].choices == []
            assert all(c.choices for c in chunks[:-1])
            assert chunks[-1].service_tier == "default" and chunks[-1].model == "mymodel"
            assert chunks[-2].choices[0].finish_reason == "length"
            usage = chunks[-1].usage
        else:
            usage = raw.parse().usage
        assert usage is not None
        assert usage.completion_tokens == 4
        assert usage.prompt_tokens > 1500
        prompt_sizes.add(usage.prompt_tokens)
        assert usage.prompt_tokens_details is not None
        cached = usage.prompt_tokens_details.cached_tokens
        assert cached is not None and 0 <= cached <= usage.prompt_tokens
        replica = replica_of(stack, raw.headers["x-request-id"])
        if replica in seen_replicas:
            assert cached == expected_cached(usage.prompt_tokens)
            hits += 1
        else:
            assert cached == 0
        seen_replicas.add(replica)
    assert hits >= 2  # 4 requests, 2 replicas: at most 2 first-time visits
    assert len(prompt_sizes) == 1
    got = engine_requests(stack)
    assert got["fast"] == [] and len(got["standard"]) == 4
    for r in got["standard"]:
        # the engine is always asked to stream with usage (a JSON answer is assembled)
        assert r["body"].get("stream_options") == {"include_usage": True}


def test_usage_chunk_raw_sse(stack: Stack) -> None:
    """On the wire with ``include_usage``: the usage event is the last before ``[DONE]``."""
    body = {"model": MODEL, "messages": MESSAGES, "stream": True, "max_tokens": 4,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", stack.base_url + "/v1/chat/completions", json=body,
                      timeout=30) as r:
        assert r.status_code == 200
        raw = r.read().decode()
    events = [e for e in raw.split("\n\n") if e and not e.startswith(":")]
    assert events[-1] == "data: [DONE]"
    docs = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert docs[-1]["choices"] == []
    assert docs[-1]["usage"]["completion_tokens"] == 4
    assert all("usage" not in d for d in docs[:-1])


# --- models --------------------------------------------------------------------------------


def test_models_list(client: OpenAI) -> None:
    models = {m.id: m for m in client.models.list()}
    assert {"mymodel", "mymodel-fast", "mymodel-auto"} <= set(models)
    assert all(m.object == "model" for m in models.values())
    extra = models["mymodel-fast"].model_extra or {}
    assert extra.get("parent") == "mymodel" and extra.get("tier") == "fast"
    assert (models["mymodel-auto"].model_extra or {}).get("tier") == "auto"
