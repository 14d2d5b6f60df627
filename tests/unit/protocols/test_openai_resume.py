"""Resume of OpenAI streams, read only after a break: the resume point, the continuation
body, the splice of the continuation's chunks, summed usage; and the JSON assembly."""

from __future__ import annotations

import orjson
import pytest

from gateway.common.sse import DONE as DONE_DATA
from gateway.common.sse import SSEEvent
from gateway.common.usage import Usage
from gateway.protocols.base import CONTENT, DONE, ERROR, SKIP, Rewrite
from gateway.protocols.openai.assemble import assemble
from gateway.protocols.openai.chat import ChatProtocol, CompletionsProtocol
from gateway.protocols.openai.resume import MAX_HEAL_CHARS, heal_tail
from gateway.protocols.openai.splice import summed_usage
from gateway.telemetry.tokencount import count_text

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
    # the last word is left out (token healing): the engine generates it again
    assert point.heal == " there"
    assert up["messages"][-1] == {"role": "assistant", "content": "Hello"}
    assert up["continue_final_message"] is True and up["add_generation_prompt"] is False
    assert up["max_tokens"] == 50 - point.tokens + count_text(" there")
    assert up["model"] == "served"
    assert up["stream_options"] == {"include_usage": True} and up["priority"] == 3
    # the engine's own count of the carried text, when it gave one, replaces the estimate
    point.carried_tokens = 1
    up = orjson.loads(ChatProtocol().continuation_body(body, "served", point))
    assert up["max_tokens"] == 49
    assert point.carried() == ("Hello", "")


def test_client_prefill_is_extended_not_duplicated() -> None:
    body = chat_body(continue_final_message=True, add_generation_prompt=False,
                     messages=[{"role": "user", "content": "hi"},
                               {"role": "assistant", "content": "Sure:"}])
    point = ChatProtocol().resume_point(body, [chunk({"content": " one"})])
    up = orjson.loads(ChatProtocol().continuation_body(body, "served", point))
    assert up["messages"][-1]["content"] == "Sure:" and len(up["messages"]) == 2
    point = ChatProtocol().resume_point(body, [chunk({"content": " one two"})])
    up = orjson.loads(ChatProtocol().continuation_body(body, "served", point))
    assert up["messages"][-1]["content"] == "Sure: one" and len(up["messages"]) == 2


def test_completions_continuation_and_rules() -> None:
    proto = CompletionsProtocol()
    body = proto.parse(b'{"model": "client", "prompt": "Once", "stream": true}')
    text = orjson.dumps({"id": "cmpl-1", "created": 1, "choices": [{"index": 0, "text": " upon"}]})
    point = proto.resume_point(body, [text])
    assert orjson.loads(proto.continuation_body(body, "served", point))["prompt"] == "Once"
    two = orjson.dumps({"id": "cmpl-1", "created": 1,
                        "choices": [{"index": 0, "text": " upon a"}]})
    point = proto.resume_point(body, [two])
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
    assert point.heal == "Hi"  # one word: generated again, dropped from the splice
    splice = codec.continuation(point, [1])

    def ev(data: bytes) -> SSEEvent:
        return SSEEvent(data=data)

    other = {"id": "chatcmpl-b", "created": 9}
    role = orjson.dumps({**other, "model": "served", "choices": [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
    assert splice.event(ev(role))[0] == SKIP
    verdict, out = splice.event(ev(chunk({"content": "Hi there"}, **{"id": "chatcmpl-b"})))
    doc = orjson.loads(out[6:].strip())
    assert verdict == CONTENT and doc["id"] == "chatcmpl-a" and doc["created"] == 7
    assert doc["choices"][0]["delta"]["content"] == " there"
    assert doc["model"] == "client" and doc["service_tier"] == "default"
    usage = orjson.dumps({**other, "model": "served", "choices": [], "usage": {
        "prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14,
        "prompt_tokens_details": {"cached_tokens": 8}}})
    verdict, out = splice.event(ev(usage))
    got = orjson.loads(out[6:].strip())["usage"]
    assert got["prompt_tokens"] == 12 + 11 and got["completion_tokens"] == 3
    assert got["prompt_tokens_details"] == {"cached_tokens": 8}
    assert splice.event(ev(DONE_DATA))[0] == DONE


@pytest.mark.parametrize(("text", "tail"), [
    ("the fast l", " l"),        # a word cut mid-way, with the space before it
    ("the fast lane", " lane"),  # maybe cut: the next token could still extend it
    ("the fast ", " "),          # trailing whitespace re-tokenizes with what follows
    ("def f():\n    ", "\n    "),
    ("word", "word"),            # one word: all of it
    ("", ""),
    ("a " + "x" * (MAX_HEAL_CHARS - 1), " " + "x" * (MAX_HEAL_CHARS - 1)),
    ("a " + "x" * MAX_HEAL_CHARS, ""),  # no boundary near the end: carried whole
    ("速度门" * 20, ""),
])
def test_heal_tail_ends_at_a_whitespace_boundary(text: str, tail: str) -> None:
    assert heal_tail(text) == tail


def _splice_after(relayed_text: str, logprobs: bool = False):
    body = chat_body(stream_options={"include_usage": True}, logprobs=logprobs)
    point = ChatProtocol().resume_point(body, [chunk({"content": relayed_text})])
    return ChatProtocol().codec(body, REWRITE).continuation(point, [1])


def test_splice_drops_the_healed_tail_across_chunks_and_relays_what_the_client_got() -> None:
    splice = _splice_after("the fast la")  # the continuation generates " lane" again
    first = SSEEvent(data=chunk({"content": " l"}))
    assert splice.event(first)[0] == SKIP  # all of it was relayed already
    second = SSEEvent(data=chunk({"content": "ane now"}))
    verdict, out = splice.event(second)
    assert verdict == CONTENT
    assert orjson.loads(out[6:].strip())["choices"][0]["delta"]["content"] == "ne now"
    # the payload kept for a later resume or an assembled answer is the client's text
    assert orjson.loads(second.data)["choices"][0]["delta"]["content"] == "ne now"
    third = SSEEvent(data=chunk({"content": " lane"}))  # healed: passes unchanged
    assert orjson.loads(splice.event(third)[1][6:].strip())["choices"][0]["delta"][
        "content"] == " lane"


def test_splice_drops_the_logprobs_of_the_healed_tokens() -> None:
    splice = _splice_after("the fast l", logprobs=True)
    lp = {"content": [{"token": " l", "logprob": -0.1, "top_logprobs": []},
                      {"token": "ane", "logprob": -0.2, "top_logprobs": []}]}
    data = orjson.dumps({"id": "chatcmpl-b", "created": 9, "model": "served", "choices": [
        {"index": 0, "delta": {"content": " lane"}, "logprobs": lp, "finish_reason": None}]})
    verdict, out = splice.event(SSEEvent(data=data))
    choice = orjson.loads(out[6:].strip())["choices"][0]
    assert verdict == CONTENT and choice["delta"]["content"] == "ane"
    assert [e["token"] for e in choice["logprobs"]["content"]] == ["ane"]


def test_splice_diverging_from_the_healed_tail_is_an_error_to_resume_again() -> None:
    splice = _splice_after("the fast l")
    verdict, _ = splice.event(SSEEvent(data=chunk({"content": " road"})))
    assert verdict == ERROR and splice.diverged
    # a finish before the whole tail came back is no divergence: the client has the text
    splice = _splice_after("the fast lane")
    assert splice.event(SSEEvent(data=chunk({"content": " la"})))[0] == SKIP
    verdict, out = splice.event(SSEEvent(data=chunk({}, finish="length")))
    assert verdict == CONTENT and not splice.diverged
    assert orjson.loads(out[6:].strip())["choices"][0]["finish_reason"] == "length"


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
