"""Regression tests for what a hostile review found (each names its finding)."""

import asyncio
import io
from contextlib import redirect_stdout

import orjson
import pytest

from gateway.cli import main
from gateway.common.sse import EventTooLarge, SSEEvent, SSEParser
from gateway.common.usage import Usage
from gateway.config import ConfigError, GatewayConfig
from gateway.errors import InvalidRequest, parse_engine_error
from gateway.protocols.body import parse_body
from gateway.protocols.openai.chat import ChatProtocol, ChunkRewriter, OpenAIStream
from gateway.relay.stream import StreamLimits, relay_events
from gateway.upstream.attempt import RetryableFailure, _read_until_content
from gateway.upstream.deadline import header_timeout_s

ROLE = SSEEvent(b'{"model":"s","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}')
TOKEN = SSEEvent(b'{"model":"s","choices":[{"index":0,"delta":{"content":"a"}}]}')
ERROR = SSEEvent(b'{"error":{"message":"engine died","type":"InternalServerError","code":500}}')


async def _relay(head, batches):
    sent: list[bytes] = []

    async def send(msg):
        sent.append(msg["body"])

    async def gen():
        for b in batches:
            yield b

    loop = asyncio.get_running_loop()
    codec = OpenAIStream(ChunkRewriter("s", "m", "default"), strip_usage=True)
    result = await relay_events(send, head, gen(), codec,
                                StreamLimits(5, 10, loop.time() + 10))
    return result, b"".join(sent)


def test_malformed_usage_is_ignored_not_a_crash():  # M1
    assert Usage.from_openai({"prompt_tokens": "lots", "completion_tokens": 1}) is None
    assert Usage.from_openai({"prompt_tokens": [1]}) is None
    assert Usage.from_openai({"prompt_tokens": 5, "completion_tokens": 2,
                              "prompt_tokens_details": {"cached_tokens": 9}}).cached == 5


async def test_malformed_usage_chunk_mid_stream_keeps_the_stream():  # M1
    bad_usage = SSEEvent(b'{"choices":[],"usage":{"prompt_tokens":[1]}}')
    result, out = await _relay([ROLE, TOKEN], [[bad_usage, SSEEvent(b"[DONE]")]])
    assert result.ok and result.usage is None and out.endswith(b"data: [DONE]\n\n")


async def test_engine_error_event_mid_stream_ends_the_stream_without_done():  # M2
    result, out = await _relay([ROLE, TOKEN], [[ERROR, SSEEvent(b"[DONE]")]])
    assert not result.ok and result.error is not None
    assert b"[DONE]" not in out
    last = orjson.loads(out.rstrip(b"\n").split(b"\n\n")[-1][6:])
    assert last["error"]["code"] == "upstream_error" and "engine died" in last["error"]["message"]


async def test_engine_error_before_content_is_retryable():  # M2
    async def gen():
        yield [ROLE, ERROR]

    with pytest.raises(RetryableFailure) as ei:
        await _read_until_content(gen(), ChatProtocol())
    assert ei.value.reason == "engine-error" and ei.value.replica_fault


async def test_malformed_event_mid_stream_is_an_error_not_forwarded():  # low
    result, out = await _relay([ROLE, TOKEN], [[SSEEvent(b'{"id": broken')]])
    assert result.error is not None and b"broken" not in out


def test_model_rewrite_survives_spaced_json():  # low
    r = ChunkRewriter("served", "client", "priority")
    data = b'{"id": "x", "model": "served", "choices": []}'
    out = orjson.loads(r.chunk(data, orjson.loads(data)))
    assert out["model"] == "client" and out["service_tier"] == "priority"
    compact = b'{"id":"x","model":"served","choices":[]}'
    assert r.chunk(compact, orjson.loads(compact)) == (
        b'{"service_tier":"priority","id":"x","model":"client","choices":[]}'
    )


@pytest.mark.parametrize(
    ("url", "message"),
    [("http://h:8000?token=x", "no query"), ("http://h:8000/#frag", "no query"),
     ("http://h:8000/v1", "without /v1")],
)
def test_endpoint_urls_with_query_or_v1_are_rejected(url, message):  # M3
    with pytest.raises(ConfigError) as ei:
        from gateway.config import load_config

        load_config(None, models={"m": {"tiers": {"standard": {
            "served_model_name": "m", "endpoints": [url]}}}})
    assert message in str(ei.value) and "token=x" not in str(ei.value)


@pytest.mark.parametrize("status", [201, 204, 302])
def test_non_error_statuses_become_502(status):  # M4
    assert parse_engine_error(status, b"").status == 502


def test_check_config_masks_credentials(tmp_path):  # M5
    cfg = tmp_path / "c.yaml"
    cfg.write_text("models: {m: {tiers: {standard: {served_model_name: m, "
                   "endpoints: ['http://user:s3cret@127.0.0.1:9000']}}}}\n")
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["check-config", str(cfg)]) == 0
    assert "s3cret" not in out.getvalue() and "***@127.0.0.1:9000" in out.getvalue()


def test_sse_parser_bounds_an_endless_event():  # M8
    p = SSEParser(max_event_bytes=1024)
    p.feed(b"data: " + b"x" * 1000)
    with pytest.raises(EventTooLarge):
        p.feed(b"x" * 100)


@pytest.mark.parametrize("value", ["1_0", "1e3", " ", "0x10"])
def test_timeout_header_accepts_plain_decimals_only(value):  # low
    with pytest.raises(InvalidRequest):
        header_timeout_s(value, None)
    assert header_timeout_s("2.5", None) == 2.5 and header_timeout_s(".5", None) == 0.5


def test_include_usage_must_be_boolean():  # low
    with pytest.raises(InvalidRequest) as ei:
        parse_body(b'{"model":"m","messages":[{"role":"user"}],"stream":true,'
                   b'"stream_options":{"include_usage":"yes"}}', "chat")
    assert ei.value.param == "stream_options.include_usage"


def test_graceful_shutdown_is_configurable():  # M6
    cfg = GatewayConfig(server={"graceful_shutdown_s": 90}, models={"m": {"tiers": {
        "standard": {"served_model_name": "m", "endpoints": ["http://h:1"]}}}})
    assert cfg.server.graceful_shutdown_s == 90


def test_session_keys_are_scoped_by_api_key():  # review: tenants share no session state
    from gateway.routing.keys import session_key

    doc = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}
    assert session_key(doc, None, scope="a") != session_key(doc, None, scope="b")
    assert session_key(doc, "s1", scope="a") != session_key(doc, "s1", scope="b")
    assert session_key(doc, "s1") == "h:s1" and session_key(doc, None) == session_key(doc, None)


async def test_lost_redis_reply_gives_the_lease_back():  # review: no slot held for an hour
    from gateway.admit.ratelimit_redis import RedisLimiter

    removed: list[tuple[str, str]] = []

    class Client:
        def register_script(self, _):
            async def fail(**_kw):
                raise TimeoutError("reply lost")
            return fail

        async def zrem(self, key, lease):
            removed.append((key, lease))

    limiter = RedisLimiter(Client(), fail_mode="open")
    from gateway.admit.ratelimit import KeyLimits

    await limiter.reserve("k", KeyLimits(requests_per_min=10, tokens_per_min=0, concurrent=1), 5)
    await asyncio.wait_for(asyncio.gather(*limiter._pending), 3)
    assert removed and removed[0][0].endswith(":slots")
