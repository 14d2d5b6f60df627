"""The protocol adapters without sockets: what each stream codec forwards, counts and ends on,
where usage is read, the first content event, the owned fields sent upstream, and the error
shapes of each API."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.common.sse import SSEEvent
from gateway.config import TelemetryConfig
from gateway.errors import GatewayError, NoHealthyReplica, UpstreamError, UpstreamTimeout
from gateway.plan.kv_fit import estimate_tokens
from gateway.protocols.base import (
    CONTENT,
    DONE,
    ERROR,
    FRAME,
    HEAD_CONTENT,
    HEAD_ERROR,
    HEAD_FRAME,
    HEAD_MALFORMED,
    Rewrite,
)
from gateway.protocols.error_shapes import ANTHROPIC_ERRORS, RESPONSES_ERRORS
from gateway.protocols.messages.protocol import CountTokensProtocol, MessagesProtocol
from gateway.protocols.openai.chat import ChatProtocol, CompletionsProtocol
from gateway.protocols.responses.protocol import ResponsesProtocol
from gateway.protocols.responses.store import MemoryResponseStore
from gateway.relay.stream import StreamLimits, relay_events
from gateway.telemetry.record import RequestRecord
from gateway.telemetry.tracing import Telemetry

REWRITE = Rewrite("served", "client", "fast")


def ev(kind: str, **doc) -> SSEEvent:
    return SSEEvent(orjson.dumps({"type": kind, **doc}), kind.encode())


def responses() -> ResponsesProtocol:
    return ResponsesProtocol(MemoryResponseStore(ttl_s=60, max_record_bytes=1 << 20,
                                                 max_entries=10))


RESP = {"id": "resp_1", "model": "served", "service_tier": "auto", "previous_response_id": None,
        "status": "in_progress", "output": [], "usage": None}
USAGE = {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 64},
         "output_tokens": 7, "total_tokens": 107}


def test_responses_codec_rewrites_the_response_object_and_reads_usage_at_the_end():
    p = responses()
    body = p.parse(b'{"model":"client","input":"hi","previous_response_id":"resp_0"}')
    codec = p.codec(body, REWRITE)
    verdict, out = codec.event(ev("response.created", sequence_number=0, response=RESP))
    assert verdict == FRAME and out.startswith(b"event: response.created\ndata: ")
    sent = orjson.loads(out.split(b"data: ", 1)[1])["response"]
    assert (sent["model"], sent["service_tier"], sent["previous_response_id"]) == (
        "client", "priority", "resp_0")
    delta = ev("response.output_text.delta", sequence_number=3, delta="Hel")
    assert codec.event(delta) == (CONTENT, b"event: response.output_text.delta\ndata: "
                                  + delta.data + b"\n\n")  # deltas are forwarded byte for byte
    assert codec.event(ev("response.output_text.done", sequence_number=4, text="x"))[0] == FRAME
    done = {**RESP, "status": "completed", "usage": USAGE}
    verdict, _ = codec.event(ev("response.completed", sequence_number=5, response=done))
    assert verdict == DONE and codec.final is not None and codec.final["model"] == "client"
    assert (codec.usage.prompt, codec.usage.cached, codec.usage.completion) == (100, 64, 7)


def test_responses_error_event_continues_the_numbering():
    codec = responses().codec(responses().parse(b'{"model":"m","input":"x"}'), REWRITE)
    codec.event(ev("response.output_text.delta", sequence_number=9, delta="a"))
    out = codec.error_event(UpstreamError("boom"))
    assert out.startswith(b"event: error\ndata: ")
    doc = orjson.loads(out.split(b"data: ", 1)[1])
    assert doc == {"type": "error", "code": "upstream_error", "message": "boom", "param": None,
                   "sequence_number": 10}
    verdict, _ = codec.event(ev("response.failed", response={**RESP, "status": "failed",
                                                             "error": {"message": "oom"}}))
    assert verdict == ERROR and "oom" in codec.error.message
    assert codec.event(SSEEvent(b"{nope", b"x"))[0] == ERROR


def test_responses_head_kind_frames_until_output():
    p = responses()
    assert p.head_kind(ev("response.created", response=RESP))[0] == HEAD_FRAME
    assert p.head_kind(ev("response.output_item.added", item={"type": "message"}))[0] == HEAD_FRAME
    assert p.head_kind(ev("response.content_part.added", part={}))[0] == HEAD_FRAME
    assert p.head_kind(ev("response.output_item.added",
                          item={"type": "function_call", "name": "f"}))[0] == HEAD_CONTENT
    assert p.head_kind(ev("response.output_text.delta", delta="a"))[0] == HEAD_CONTENT
    kind, err = p.head_kind(ev("error", code="x", message="engine died"))
    assert kind == HEAD_ERROR and "engine died" in err.message
    assert p.head_kind(SSEEvent(b"[DONE]"))[0] == HEAD_MALFORMED


def test_responses_upstream_body_owns_store_request_id_and_previous_id():
    p = responses()
    body = p.parse(b'{"model": "client", "input": "hi", "top_k": 5}')
    out = p.upstream_body(body, "served")
    assert out.startswith(b'{"request_id":"resp_')  # spliced: the client's bytes follow
    doc = orjson.loads(out)
    assert doc == {"request_id": body.ext.response_id, "store": False, "model": "served",
                   "input": "hi", "top_k": 5}
    body = p.parse(b'{"model":"client","input":"hi","store":true,"request_id":"mine"}')
    doc = orjson.loads(p.upstream_body(body, "served"))
    assert doc["store"] is False and doc["request_id"] == body.ext.response_id != "mine"


def test_responses_chain_is_expanded_from_the_store_and_scoped_to_the_key():
    async def main():
        p = responses()
        store = p.state.store
        await store.put({"id": "resp_r1", "key": "k", "items": [{"role": "user", "content": "a"}],
                         "output": [{"type": "message", "role": "assistant", "content": "b"}],
                         "chain": [], "root": "resp_r1", "response": {}})
        await store.put({"id": "resp_r2", "key": "k", "items": [{"role": "user", "content": "c"}],
                         "output": [{"type": "function_call", "call_id": "c1", "name": "f",
                                     "arguments": "{}"}],
                         "chain": ["resp_r1"], "root": "resp_r1", "response": {}})
        body = p.parse(b'{"model":"m","previous_response_id":"resp_r2","input":[{"type":'
                       b'"function_call_output","call_id":"c1","output":"ok"}]}')
        await p.prepare(body, "k")
        turn = body.ext
        assert [i.get("content", i.get("type")) for i in turn.full_input] == [
            "a", "b", "c", "function_call", "function_call_output"]
        assert turn.chain == ["resp_r1", "resp_r2"] and body.session_hint == "resp:resp_r1"
        roles = [m["role"] for m in body.view["messages"]]
        assert roles == ["user", "assistant", "user", "assistant", "tool"]
        sent = orjson.loads(p.upstream_body(body, "m"))
        assert "previous_response_id" not in sent and len(sent["input"]) == 5
        for key, prev in (("other", "resp_r2"), ("k", "nope")):
            other = p.parse(b'{"model":"m","input":"x","previous_response_id":"%s"}'
                            % prev.encode())
            with pytest.raises(GatewayError) as e:
                await p.prepare(other, key)
            assert e.value.status == 404 and e.value.param == "previous_response_id"
        await store.delete("resp_r1")  # an expired ancestor breaks the chain: 404, not a guess
        with pytest.raises(GatewayError) as e:
            await p.prepare(p.parse(b'{"model":"m","input":"x","previous_response_id":"resp_r2"}'),
                            "k")
        assert e.value.status == 404

    asyncio.run(main())


def test_responses_bad_bodies_name_the_field():
    p = responses()
    for raw, param in ((b'{"model":"m"}', "input"), (b'{"model":"m","input":7}', "input"),
                       (b'{"model":"m","input":"x","background":true}', "background"),
                       (b'{"model":"m","input":"x","store":"yes"}', "store"),
                       (b'{"model":"m","input":"x","previous_response_id":""}',
                        "previous_response_id")):
        with pytest.raises(GatewayError) as e:
            p.parse(raw)
        assert e.value.status == 400 and e.value.param == param


def test_messages_codec_merges_usage_and_rewrites_message_start():
    codec = MessagesProtocol().codec(None, REWRITE)  # type: ignore[arg-type]
    start = ev("message_start", message={"id": "m", "type": "message", "model": "served",
                                         "usage": {"input_tokens": 120, "output_tokens": 0}})
    verdict, out = codec.event(start)
    msg = orjson.loads(out.split(b"data: ", 1)[1])["message"]
    assert verdict == FRAME and msg["model"] == "client"
    assert msg["usage"]["service_tier"] == "priority"
    assert codec.event(ev("ping"))[0] == FRAME
    assert codec.event(ev("content_block_start", index=0,
                          content_block={"type": "text", "text": ""}))[0] == FRAME
    assert codec.event(ev("content_block_start", index=1,
                          content_block={"type": "tool_use", "name": "f"}))[0] == CONTENT
    assert codec.event(ev("content_block_delta", index=1,
                          delta={"type": "input_json_delta", "partial_json": "{"}))[0] == CONTENT
    codec.event(ev("message_delta", delta={"stop_reason": "end_turn"},
                   usage={"input_tokens": 20, "output_tokens": 9,
                          "cache_read_input_tokens": 100}))
    assert codec.event(ev("message_stop"))[0] == DONE
    assert (codec.usage.prompt, codec.usage.cached, codec.usage.completion) == (120, 100, 9)
    verdict, out = codec.event(ev("error", error={"type": "overloaded_error", "message": "x"}))
    assert verdict == ERROR and out.startswith(b"event: error\ndata: ")
    # an engine's overload stays one for the client (Anthropic's 529 type)
    assert orjson.loads(out.split(b"data: ", 1)[1])["error"]["type"] == "overloaded_error"


def test_messages_head_kind_and_parse():
    p = MessagesProtocol()
    assert p.head_kind(ev("message_start", message={}))[0] == HEAD_FRAME
    assert p.head_kind(ev("ping"))[0] == HEAD_FRAME
    assert p.head_kind(ev("content_block_delta", delta={"text": "a"}))[0] == HEAD_CONTENT
    assert p.head_kind(ev("error", error={"message": "no"}))[0] == HEAD_ERROR
    body = p.parse(b'{"model":"m","max_tokens":9,"system":[{"type":"text","text":"S"}],'
                   b'"messages":[{"role":"user","content":[{"type":"text","text":"q"}]},'
                   b'{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f",'
                   b'"input":{"a":1}}]},{"role":"user","content":[{"type":"tool_result",'
                   b'"tool_use_id":"t1","content":"r"}]}]}')
    msgs = body.view["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool"]
    assert msgs[2]["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a":1}'}
    assert body.view["max_tokens"] == 9
    assert p.service_tier({"service_tier": "standard_only"}) == "default"
    for raw, param in ((b'{"model":"m","messages":[{"role":"user","content":"x"}]}',
                        "max_tokens"),
                       (b'{"model":"m","max_tokens":5,"messages":[]}', "messages"),
                       (b'{"model":"m","max_tokens":5,"service_tier":"fast",'
                        b'"messages":[{"role":"user","content":"x"}]}', "service_tier")):
        with pytest.raises(GatewayError) as e:
            p.parse(raw)
        assert e.value.param == param
    counted = CountTokensProtocol().parse(b'{"model":"m","messages":[{"role":"user",'
                                          b'"content":"x"}]}')
    assert counted.view["messages"][0]["content"] == "x"  # no max_tokens needed


@pytest.mark.parametrize(("err", "status", "kind"), [
    (NoHealthyReplica("none", retry_after_s=1), 529, "overloaded_error"),
    (UpstreamError("engine down"), 500, "api_error"),
    (UpstreamTimeout("ttft", 1.0), 504, "timeout_error"),
    (GatewayError("slow down", status=429), 429, "rate_limit_error"),
    (GatewayError("no", status=401), 401, "authentication_error"),
    (GatewayError("big", status=413), 413, "request_too_large"),
    (GatewayError("odd", status=415), 415, "invalid_request_error"),
])
def test_anthropic_error_shapes(err, status, kind):
    assert ANTHROPIC_ERRORS.status(err) == status
    doc = orjson.loads(ANTHROPIC_ERRORS.body(err, "req-1"))
    assert doc == {"type": "error", "error": {"type": kind, "message": err.message},
                   "request_id": "req-1"}
    if err.retry_after_s:
        assert ANTHROPIC_ERRORS.headers(err) == [(b"retry-after", b"1"),
                                                 (b"x-should-retry", b"true")]


def test_responses_errors_keep_the_openai_body():
    err = UpstreamTimeout("stall", 2.0)
    assert RESPONSES_ERRORS.status(err) == 504
    assert orjson.loads(RESPONSES_ERRORS.body(err))["error"]["code"] == "upstream_timeout"


async def test_relay_ends_a_broken_messages_stream_with_an_anthropic_error_event():
    sent: list[bytes] = []

    async def send(msg):
        sent.append(msg["body"])

    async def broken():
        yield [ev("content_block_delta", index=0, delta={"type": "text_delta", "text": "b"})]

    head = [ev("message_start", message={"model": "served", "usage": {"input_tokens": 3}}),
            ev("content_block_delta", index=0, delta={"type": "text_delta", "text": "a"})]
    loop = asyncio.get_running_loop()
    result = await relay_events(send, head, broken(), MessagesProtocol().codec(None, REWRITE),  # type: ignore[arg-type]
                                StreamLimits(5, 10, loop.time() + 10))
    out = b"".join(sent)
    assert not result.ok and result.events == 2 and result.usage.prompt == 3
    assert out.endswith(b"\n\n") and b"event: error\ndata: " in out
    assert b"message_stop" not in out


def test_request_spans_name_each_protocols_operation():
    exporter = InMemorySpanExporter()
    tel = Telemetry(TelemetryConfig(), span_exporter=exporter)
    protos = [ChatProtocol(), CompletionsProtocol(), responses(), MessagesProtocol(),
              CountTokensProtocol()]
    for p in protos:
        tel.start_request([], p.operation, p.span_attributes()).finish(
            RequestRecord("r", p.path, operation=p.operation, model="m", outcome="ok"))
    got = [(s.name, s.attributes["gen_ai.operation.name"], s.attributes.get("openai.api.type"))
           for s in exporter.get_finished_spans()]
    assert got == [("chat m", "chat", "chat_completions"),
                   ("text_completion m", "text_completion", None),
                   ("chat m", "chat", "responses"), ("chat m", "chat", None),
                   ("count_tokens m", "count_tokens", None)]


def test_rate_limit_estimates_count_each_apis_conversation_and_cap():
    async def main():
        msgs = MessagesProtocol().parse(
            b'{"model":"m","max_tokens":100,"system":"' + b"word " * 50 + b'",'
            b'"messages":[{"role":"user","content":"' + b"word " * 50 + b'"}]}')
        resp = responses().parse(
            b'{"model":"m","max_output_tokens":100,"instructions":"' + b"word " * 50 + b'",'
            b'"input":"' + b"word " * 50 + b'"}')
        chat = ChatProtocol().parse(
            b'{"model":"m","max_tokens":100,"messages":[{"role":"system","content":"'
            + b"word " * 50 + b'"},{"role":"user","content":"' + b"word " * 50 + b'"}]}')
        got = [await estimate_tokens(b.conversation, "chat", len(b.raw), "cl100k_base")
               for b in (msgs, resp, chat)]
        assert got[0] == got[1] == got[2] > 200  # prompt (~100 words) + the 100-token cap

    asyncio.run(main())
