"""Compression, Retry-After, usage the client did not ask
for, oversized events. The gateway app in-process in front of scripted engines
(``engine_double``): what the client gets, what each replica received, and what outlier
detection holds against each replica."""

from __future__ import annotations

import asyncio
import gzip
import time
from email.utils import formatdate

import orjson
import pytest
from aiohttp import web

from gateway.common.sse import MAX_EVENT_BYTES
from gateway.upstream.attempt import parse_retry_after
from tests.unit.upstream.engine_double import (
    chunk,
    completion,
    gateway_on,
    gzip_if_asked,
    sse,
)

CHAT = "/v1/chat/completions"
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _events(raw: bytes) -> list[dict]:
    out = []
    for ev in raw.split(b"\n\n"):
        if ev.startswith(b"data: ") and ev != b"data: [DONE]":
            out.append(orjson.loads(ev[6:]))
    return out


def _content(docs: list[dict]) -> str:
    return "".join(d["choices"][0]["delta"].get("content") or ""
                   for d in docs if d.get("choices"))


STREAM_EVENTS = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "Hel"}),
    chunk({"content": "lo"}),
    chunk({}, finish="stop"),
    chunk(usage={"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}, choices=False),
    b"data: [DONE]\n\n",
]


# --- compression -----------------------------------------------------------------------------


async def test_item2_compression_gateway_asks_identity_behind_a_compressing_ingress():
    async def script(request: web.Request, i: int) -> web.StreamResponse:
        return gzip_if_asked(request, orjson.dumps(completion()))

    async with gateway_on(script) as bench:
        for _ in range(4):
            r = await bench.client.post(CHAT, json=BODY)
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"] == "Hello"
        assert [s.headers.get("accept-encoding") for s in bench.seen] == ["identity"] * 4
        assert len(bench.seen) == 4  # no retries
        assert bench.failures() == [0, 0]


@pytest.mark.parametrize("stream", [False, True])
async def test_item2_compression_gzip_sent_anyway_is_decoded(stream: bool):
    """A proxy that compresses whatever the gateway asked for: gzip is decoded (streams
    chunk by chunk)."""

    async def script(request: web.Request, i: int) -> web.StreamResponse:
        if not stream:
            return web.Response(body=gzip.compress(orjson.dumps(completion())),
                                content_type="application/json",
                                headers={"Content-Encoding": "gzip"})
        packed = gzip.compress(b"".join(STREAM_EVENTS))
        parts = [packed[i:i + 7] for i in range(0, len(packed), 7)]
        return await sse(request, parts, {"Content-Encoding": "gzip"})

    async with gateway_on(script) as bench:
        r = await bench.client.post(CHAT, json=BODY | {"stream": stream})
        assert r.status_code == 200, r.text
        if stream:
            assert _content(_events(r.content)) == "Hello"
            assert r.content.endswith(b"data: [DONE]\n\n")
        else:
            assert r.json()["choices"][0]["message"]["content"] == "Hello"
        assert len(bench.seen) == 1 and bench.failures() == [0, 0]


@pytest.mark.parametrize("stream", [False, True])
async def test_item2_compression_undecodable_is_one_502_and_no_replica_failure(stream: bool):
    """A coding the gateway cannot decode is the same on every replica behind the proxy: not
    retried, not counted against the replica's health, one 502."""

    async def script(request: web.Request, i: int) -> web.StreamResponse:
        return web.Response(body=b"\x1b\x00\xf8binary", content_type="application/json",
                            headers={"Content-Encoding": "br"})

    async with gateway_on(script, pool={"retry": {"max_attempts": 3}}) as bench:
        r = await bench.client.post(CHAT, json=BODY | {"stream": stream})
        assert r.status_code == 502, r.text
        err = r.json()["error"]
        assert err["code"] == "upstream_unreadable" and "Content-Encoding" in err["message"]
        assert len(bench.seen) == 1
        assert bench.failures() == [0, 0]


# --- Retry-After -----------------------------------------------------------------------------


def test_item2_retry_after_both_forms_of_rfc9110():
    now = 1_700_000_000.0
    assert parse_retry_after("120", now=now) == 120.0
    assert parse_retry_after(formatdate(now + 30, usegmt=True), now=now) == pytest.approx(30)
    assert parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now=now) == 0.0  # past: now
    assert parse_retry_after("Sunday, 06-Nov-94 08:49:37 GMT", now=784111777.0 - 5) == 5.0
    assert parse_retry_after("Sun Nov  6 08:49:37 1994", now=784111777.0 - 5) == 5.0
    for bad in ("soon", "-1", "nan", "inf", ""):
        assert parse_retry_after(bad, now=now) is None


async def test_item2_retry_after_503_not_waitable_passes_through_as_503():
    async def script(request: web.Request, i: int) -> web.StreamResponse:
        return web.json_response({"error": {"message": "overloaded", "type": "x", "code": 503}},
                                 status=503, headers={"Retry-After": "30"})

    async with gateway_on(script) as bench:
        r = await bench.client.post(CHAT, json=BODY)
        assert r.status_code == 503, r.text
        assert r.headers["retry-after"] == "30"
        assert r.json()["error"]["code"] == "upstream_unavailable"
        assert "overloaded" in r.json()["error"]["message"]
        assert sorted(s.replica for s in bench.seen) == [0, 1]  # each replica asked once


async def test_item2_retry_after_http_date_is_honoured():
    """One replica answers 503 with an HTTP-date about 2 s ahead: the gateway waits and asks
    again instead of answering 502 at once."""
    calls = []

    async def script(request: web.Request, i: int) -> web.StreamResponse:
        calls.append(time.monotonic())
        if len(calls) == 1:
            return web.json_response({"error": {"message": "busy"}}, status=503,
                                     headers={"Retry-After": formatdate(time.time() + 2,
                                                                        usegmt=True)})
        return web.json_response(completion())

    pool = {"retry": {"max_attempts": 2, "max_retry_after_s": 3}}
    async with gateway_on(script, replicas=1, pool=pool) as bench:
        r = await bench.client.post(CHAT, json=BODY)
        assert r.status_code == 200, r.text
        assert len(calls) == 2 and calls[1] - calls[0] >= 0.9


@pytest.mark.slow
async def test_item2_retry_after_on_504():
    async def script(request: web.Request, i: int) -> web.StreamResponse:
        await asyncio.sleep(5)
        return web.json_response(completion())

    async with gateway_on(script, replicas=1) as bench:
        r = await bench.client.post(CHAT, json=BODY, headers={"x-speedgate-timeout": "0.3"})
        assert r.status_code == 504, r.text
        assert r.headers["retry-after"] == "1"
        r = await bench.client.post(CHAT, json=BODY | {"stream": True},
                                    headers={"x-speedgate-timeout": "0.3"})
        assert r.status_code == 504 and r.headers["retry-after"] == "1"


# --- usage the client did not ask for --------------------------------------------------------


def _usage_everywhere(always: bool):
    """vLLM's stream_options semantics (usage on every chunk with include_usage and
    continuous_usage_stats, one usage chunk with include_usage); ``always``: a server that
    puts usage on every chunk whenever include_usage is set."""

    async def script(request: web.Request, i: int) -> web.StreamResponse:
        opts = (await request.json()).get("stream_options") or {}
        include = bool(opts.get("include_usage"))
        every = include and (always or bool(opts.get("continuous_usage_stats")))
        u = {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8}
        events = [chunk({"role": "assistant", "content": ""}, usage=u if every else None),
                  chunk({"content": "Hel"}, usage=u if every else None),
                  chunk({"content": "lo"}, usage=u | {"completion_tokens": 2} if every else None),
                  chunk({}, finish="stop", usage=u | {"completion_tokens": 2} if every else None)]
        if include:
            events.append(chunk(usage=u | {"completion_tokens": 2}, choices=False))
        return await sse(request, [*events, b"data: [DONE]\n\n"])

    return script


@pytest.mark.parametrize("always", [False, True], ids=["vllm", "usage-on-every-chunk"])
async def test_item2_usage_continuous_usage_stats_without_include_usage_gets_none(always):
    async with gateway_on(_usage_everywhere(always)) as bench:
        body = BODY | {"stream": True, "stream_options": {"continuous_usage_stats": True}}
        r = await bench.client.post(CHAT, json=body, headers={"x-session-id": "s-cont"})
        assert r.status_code == 200, r.text
        docs = _events(r.content)
        assert _content(docs) == "Hello"
        assert [d for d in docs if "usage" in d] == []
        sent = bench.seen[0].doc["stream_options"]
        assert sent["include_usage"] is True and sent["continuous_usage_stats"] is False
        totals = (await bench.client.get("/v1/usage", params={"session_id": "s-cont"})).json()
        assert totals["output_tokens"] == 2 and totals["estimated_requests"] == 0, totals


async def test_item2_usage_client_that_asked_keeps_continuous_usage():
    async with gateway_on(_usage_everywhere(False)) as bench:
        body = BODY | {"stream": True,
                       "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        r = await bench.client.post(CHAT, json=body)
        docs = _events(r.content)
        assert all("usage" in d for d in docs)


async def test_item2_usage_on_the_finish_chunk_is_read_not_estimated():
    async def script(request: web.Request, i: int) -> web.StreamResponse:
        return await sse(request, [
            chunk({"role": "assistant", "content": ""}),
            chunk({"content": "Hello"}),
            chunk({}, finish="stop",
                  usage={"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16}),
            b"data: [DONE]\n\n",
        ])

    async with gateway_on(script) as bench:
        r = await bench.client.post(CHAT, json=BODY | {"stream": True},
                                    headers={"x-session-id": "s-finish"})
        assert r.status_code == 200, r.text
        docs = _events(r.content)
        assert _content(docs) == "Hello" and [d for d in docs if "usage" in d] == []
        assert docs[-1]["choices"][0]["finish_reason"] == "stop"
        totals = (await bench.client.get("/v1/usage", params={"session_id": "s-finish"})).json()
        assert (totals["input_tokens"], totals["output_tokens"]) == (11, 5), totals
        assert totals["estimated_requests"] == 0, totals


# --- oversized events ------------------------------------------------------------------------


@pytest.mark.parametrize("mid_stream", [False, True])
async def test_item2_oversized_event_is_one_502_not_retried_not_a_replica_failure(mid_stream):
    big = b"data: " + b"x" * (MAX_EVENT_BYTES + 1024)

    async def script(request: web.Request, i: int) -> web.StreamResponse:
        head = STREAM_EVENTS[:2] if mid_stream else []
        return await sse(request, [*head, big[: len(big) // 2], big[len(big) // 2:]])

    async with gateway_on(script, pool={"retry": {"max_attempts": 3}}) as bench:
        r = await bench.client.post(CHAT, json=BODY | {"stream": True})
        if mid_stream:
            assert r.status_code == 200
            last = _events(r.content)[-1]
            assert last["error"]["code"] == "upstream_unreadable"
            assert b"[DONE]" not in r.content
        else:
            assert r.status_code == 502, r.text
            assert r.json()["error"]["code"] == "upstream_unreadable"
        assert len(bench.seen) == 1
        assert bench.failures() == [0, 0]
