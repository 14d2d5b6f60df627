"""Resume of OpenAI streams, read only after a break: the resume point, the continuation
body, the splice of the continuation's chunks, summed usage; and the JSON assembly."""

from __future__ import annotations

import orjson
import pytest

from gateway.common.usage import Usage
from gateway.protocols.base import CONTENT, DONE, SKIP, Rewrite
from gateway.protocols.openai_assemble import assemble
from gateway.protocols.openai_chat import ChatProtocol, CompletionsProtocol
from gateway.protocols.openai_resume import summed_usage
from gateway.relay.sse import DONE as DONE_DATA
from gateway.relay.sse import SSEEvent

REWRITE = Rewrite("served", "client", "standard")


def chunk(delta: dict, finish: str | None = None, index: int = 0, **top) -> bytes:
    return orjson.dumps({"id": "chatcmpl-a", "object": "chat.completion.chunk", "created": 7,
                         "model": "served", "choices": [
                             {"index": index, "delta": delta, "logprobs": None,
                              "finish_reason": finish}], **top})


def chat_body(**doc) -> object:
    raw = orjson.dumps({"model": "client", "messages": [{"role": "user", "content": "hi"}],
                        "stream": True, **doc})
    return ChatProtocol().parse(raw)


def test_resume_point_rebuilds_text_and_reasoning_only_on_demand() -> None:
    relayed = [chunk({"role": "assistant", "content": ""}), chunk({"reasoning": "think "}),
               chunk({"content": "Hello"}), chunk({"content": " world"})]
    point = ChatProtocol().resume_point(chat_body(), relayed)
    assert (point.text, point.reasoning, point.blocker) == ("Hello world", "think ", None)
    assert (point.id, point.created) == ("chatcmpl-a", 7)
    assert point.tokens >= 3


@pytest.mark.parametrize(("doc", "relayed", "blocker"), [
    ({"n": 2}, [chunk({"content": "a"})], "n>1"),
    ({}, [chunk({"content": "a"}), chunk({"content": "b"}, index=1)], "n>1"),
    ({}, [chunk({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f"}}]})],
     "tool-call"),
    ({}, [chunk({"content": "a"}, finish="stop")], "finished"),
    ({"response_format": {"type": "json_object"}}, [chunk({"content": "{"})],
     "structured-output"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}},
     [chunk({"content": "{"})], "structured-output"),
    ({"guided_json": {"type": "object"}}, [chunk({"content": "{"})], "structured-output"),
    ({"guided_regex": "[a-z]+"}, [chunk({"content": "a"})], "structured-output"),
    ({"guided_choice": ["yes", "no"]}, [chunk({"content": "y"})], "structured-output"),
    ({"guided_grammar": "root ::= 'a'"}, [chunk({"content": "a"})], "structured-output"),
    ({"structured_outputs": {"json": {}}}, [chunk({"content": "{"})], "structured-output"),
    ({"response_format": {"type": "text"}}, [chunk({"content": "a"})], None),
])
def test_what_cannot_be_resumed_is_named(doc: dict, relayed: list[bytes], blocker: str) -> None:
    assert ChatProtocol().resume_point(chat_body(**doc), relayed).blocker == blocker


def test_chat_continuation_body() -> None:
    body = chat_body(max_tokens=50, stream_options={"include_usage": False,
                                                    "continuous_usage_stats": True})
    point = ChatProtocol().resume_point(body, [chunk({"content": "Hello there"})])
    up = orjson.loads(ChatProtocol().continuation_body(body, "served", point, priority=3))
    assert up["messages"][-1] == {"role": "assistant", "content": "Hello there"}
    assert up["continue_final_message"] is True and up["add_generation_prompt"] is False
    assert up["max_tokens"] == 50 - point.tokens and up["model"] == "served"
    assert up["stream_options"] == {"include_usage": True} and up["priority"] == 3


def test_client_prefill_is_extended_not_duplicated() -> None:
    body = chat_body(continue_final_message=True, add_generation_prompt=False,
                     messages=[{"role": "user", "content": "hi"},
                               {"role": "assistant", "content": "Sure:"}])
    point = ChatProtocol().resume_point(body, [chunk({"content": " one"})])
    up = orjson.loads(ChatProtocol().continuation_body(body, "served", point))
    assert up["messages"][-1]["content"] == "Sure: one" and len(up["messages"]) == 2


def test_completions_continuation_and_rules() -> None:
    proto = CompletionsProtocol()
    body = proto.parse(b'{"model": "client", "prompt": "Once", "stream": true}')
    text = orjson.dumps({"id": "cmpl-1", "created": 1, "choices": [{"index": 0, "text": " upon"}]})
    point = proto.resume_point(body, [text])
    assert orjson.loads(proto.continuation_body(body, "served", point))["prompt"] == "Once upon"
    ids = proto.parse(b'{"model": "client", "prompt": [1, 2], "stream": true}')
    assert proto.resume_point(ids, [text]).blocker == "prompt"
    echo = proto.parse(b'{"model": "client", "prompt": "x", "echo": true, "stream": true}')
    assert proto.resume_point(echo, [text]).blocker == "echo"


def test_summed_usage_counts_every_attempt() -> None:
    # attempt 1 produced 10 tokens on a 100-token prompt; the continuation prefilled 110
    total = summed_usage(Usage(110, 20, 64), [10])
    assert total == Usage(100 + 110, 30, 64)


def test_splice_keeps_ids_drops_role_sums_usage() -> None:
    body = chat_body(stream_options={"include_usage": True})
    codec = ChatProtocol().codec(body, REWRITE)
    point = ChatProtocol().resume_point(body, [chunk({"content": "Hi"})])
    splice = codec.continuation(point, [1])

    def ev(data: bytes) -> SSEEvent:
        return SSEEvent(data=data)

    other = {"id": "chatcmpl-b", "created": 9}
    role = orjson.dumps({**other, "model": "served", "choices": [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
    assert splice.event(ev(role))[0] == SKIP
    verdict, out = splice.event(ev(chunk({"content": " there"}, **{"id": "chatcmpl-b"})))
    doc = orjson.loads(out[6:].strip())
    assert verdict == CONTENT and doc["id"] == "chatcmpl-a" and doc["created"] == 7
    assert doc["model"] == "client" and doc["service_tier"] == "default"
    usage = orjson.dumps({**other, "model": "served", "choices": [], "usage": {
        "prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14,
        "prompt_tokens_details": {"cached_tokens": 8}}})
    verdict, out = splice.event(ev(usage))
    got = orjson.loads(out[6:].strip())["usage"]
    assert got["prompt_tokens"] == 12 + 11 and got["completion_tokens"] == 3
    assert got["prompt_tokens_details"] == {"cached_tokens": 8}
    assert splice.event(ev(DONE_DATA))[0] == DONE


def test_assemble_merges_tool_calls_and_logprobs() -> None:
    lp = {"content": [{"token": "a", "logprob": -0.5}]}
    relayed = [
        chunk({"role": "assistant", "content": ""}),
        orjson.dumps({"id": "x", "created": 1, "model": "m", "choices": [
            {"index": 0, "delta": {"content": "a"}, "logprobs": lp, "finish_reason": None}]}),
        chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                               "function": {"name": "f", "arguments": ""}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a":'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": " 1}"}}]},
              finish="tool_calls"),
        orjson.dumps({"id": "x", "choices": [], "system_fingerprint": "fp", "usage": {
            "prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7,
            "prompt_tokens_details": None}}),
    ]
    doc = assemble(relayed, None, chat=True)
    choice = doc["choices"][0]
    assert choice["message"]["content"] == "a"
    assert choice["message"]["tool_calls"] == [{"id": "call_1", "type": "function", "function": {
        "name": "f", "arguments": '{"a": 1}'}}]
    assert choice["logprobs"] == lp and choice["finish_reason"] == "tool_calls"
    assert doc["usage"]["total_tokens"] == 7 and doc["system_fingerprint"] == "fp"


@pytest.mark.parametrize("proto, extra", [
    (ChatProtocol(), {"messages": [{"role": "user", "content": "hi"}]}),
    (CompletionsProtocol(), {"prompt": "hi"}),
])
def test_prompt_logprobs_go_upstream_as_json(proto, extra: dict) -> None:
    """vLLM refuses prompt_logprobs with stream=True: such a request is not assembled."""
    plain = proto.parse(orjson.dumps({"model": "m", **extra}))
    assert plain.assemble
    assert orjson.loads(proto.upstream_body(plain, "served"))["stream"] is True
    for value in (0, 1):
        body = proto.parse(orjson.dumps({"model": "m", "prompt_logprobs": value, **extra}))
        assert not body.assemble and not body.upstream_stream
        sent = orjson.loads(proto.upstream_body(body, "served"))
        assert not sent.get("stream") and "stream_options" not in sent
        assert sent["prompt_logprobs"] == value
