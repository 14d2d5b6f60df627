"""Resume of Responses streams: the resume point read from the relayed payloads and the codec's
framing, the chat-completions continuation body, and the splice of its chunks into the
Responses stream (sequence numbers, item id and indices, one set of done events, usage summed)."""

from __future__ import annotations

import orjson

from gateway.common.sse import SSEEvent
from gateway.protocols.base import (
    CONTENT,
    DONE,
    ERROR,
    FRAME,
    HEAD_CONTENT,
    HEAD_FRAME,
    SKIP,
    Rewrite,
    StreamCodec,
)
from gateway.protocols.body import ParsedBody
from gateway.protocols.openai.splice import Usage, summed_usage
from gateway.protocols.responses.protocol import ResponsesProtocol
from gateway.protocols.responses.resume import ResponsesSplice
from gateway.protocols.responses.store import MemoryResponseStore

P = ResponsesProtocol(MemoryResponseStore(ttl_s=60, max_record_bytes=1 << 20, max_entries=10))
REWRITE = Rewrite(served_model="served", client_model="client", tier="fast")


def body(**doc: object) -> ParsedBody:
    raw = orjson.dumps({"model": "client", "stream": True, "input": "hi", **doc})
    return P.parse(raw)


def ev(kind: str, seq: int, **doc: object) -> SSEEvent:
    return SSEEvent(orjson.dumps({"type": kind, "sequence_number": seq, **doc}), kind.encode())


def text_delta(seq: int, t: str, item: str = "msg_1", index: int = 1) -> SSEEvent:
    return ev("response.output_text.delta", seq, item_id=item, output_index=index,
              content_index=0, delta=t, logprobs=[])


def chunk(content: str | None = None, finish: str | None = None, **extra: object) -> SSEEvent:
    d = {} if content is None else {"content": content}
    return SSEEvent(orjson.dumps({"id": "c", "choices": [
        {"index": 0, "delta": {**d, **extra}, "finish_reason": finish}]}))


RESP = {"id": "resp_1", "object": "response", "model": "served", "status": "in_progress",
        "output": [], "usage": None, "service_tier": "auto"}
REASONING = {"id": "rs_1", "type": "reasoning", "summary": [], "status": "completed",
             "content": [{"type": "reasoning_text", "text": "hmm "}]}


def opened_stream(b: ParsedBody) -> tuple[StreamCodec, list[bytes]]:
    """A codec that relayed a reasoning item then the start of a message (``Hello wor``);
    the content payloads it relayed (what ``ex.relayed`` would hold)."""
    codec = P.codec(b, REWRITE)
    events = [
        ev("response.created", 0, response=RESP), ev("response.in_progress", 1, response=RESP),
        ev("response.output_item.added", 2, output_index=0,
           item={"id": "rs_1", "type": "reasoning", "summary": [], "content": []}),
        ev("response.reasoning_text.delta", 3, item_id="rs_1", output_index=0,
           content_index=0, delta="hmm "),
        ev("response.output_item.done", 4, output_index=0, item=REASONING),
        ev("response.output_item.added", 5, output_index=1, item={
            "id": "msg_1", "type": "message", "role": "assistant", "status": "in_progress",
            "content": []}),
        ev("response.content_part.added", 6, item_id="msg_1", output_index=1,
           content_index=0, part={"type": "output_text", "text": ""}),
        text_delta(7, "Hello"), text_delta(8, " wor"),
    ]
    relayed = []
    for e in events:
        verdict, _ = codec.event(e)
        if verdict == CONTENT:
            assert e.data is not None
            relayed.append(e.data)
    return codec, relayed


def test_resume_point_of_a_message_after_reasoning() -> None:
    b = body()
    codec, relayed = opened_stream(b)
    point = P.resume_point(b, relayed)
    assert (point.text, point.reasoning, point.id, point.blocker) == (
        "Hello wor", "hmm ", "msg_1", None)
    assert codec.resume_blocker(point) is None
    assert point.heal == " wor" and point.carried() == ("Hello", "hmm ")


def test_resume_point_blockers() -> None:
    b = body()
    call = orjson.dumps({"type": "response.output_item.added", "output_index": 1,
                         "item": {"type": "function_call", "name": "f", "id": "fc_1"}})
    args = orjson.dumps({"type": "response.function_call_arguments.delta", "delta": "{"})
    think = orjson.dumps({"type": "response.reasoning_text.delta", "delta": "x"})
    refusal = orjson.dumps({"type": "response.refusal.delta", "delta": "no"})
    text = text_delta(0, "a ").data
    other = text_delta(1, "b", item="msg_2").data
    assert text is not None and other is not None
    assert P.resume_point(b, [text, call]).blocker == "tool-call"
    assert P.resume_point(b, [args]).blocker == "tool-call"
    assert P.resume_point(b, [think]).blocker == "thinking"
    assert P.resume_point(b, [refusal]).blocker == "protocol"
    assert P.resume_point(b, [text, other]).blocker == "protocol"
    assert P.resume_point(b, []).blocker == "protocol"
    fmt = body(text={"format": {"type": "json_schema", "name": "x", "schema": {}}})
    assert P.resume_point(fmt, [text]).blocker == "structured-output"
    verbosity = body(text={"verbosity": "low"})
    assert P.resume_point(verbosity, [text]).blocker is None


def test_codec_blocks_a_resume_once_the_text_or_item_was_closed() -> None:
    b = body()
    codec, relayed = opened_stream(b)
    codec.event(ev("response.output_text.done", 9, item_id="msg_1", output_index=1,
                   content_index=0, text="Hello wor"))
    assert codec.resume_blocker(P.resume_point(b, relayed)) == "finished"
    codec, relayed = opened_stream(b)
    codec.event(ev("response.output_item.done", 9, output_index=1, item={"id": "msg_1"}))
    assert codec.resume_blocker(P.resume_point(b, relayed)) == "block-closed"


def test_continuation_body_is_vllms_chat_conversion_continuing_the_text() -> None:
    b = body(instructions="be brief", max_output_tokens=50, temperature=0.2,
             reasoning={"effort": "low"}, store=True, include=["reasoning.encrypted_content"],
             tool_choice="auto", parallel_tool_calls=False,
             tools=[{"type": "function", "name": "ls", "description": "list",
                     "parameters": {"type": "object"}}, {"type": "web_search"}],
             input=[{"role": "user", "content": [{"type": "input_text", "text": "list"}]},
                    {"type": "reasoning", "id": "rs_0", "summary": []},
                    {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "c1", "output": "a b"}])
    _, relayed = opened_stream(b)
    point = P.resume_point(b, relayed)
    point.carried_tokens = 3
    doc = orjson.loads(P.continuation_body(b, "served", point, priority=2))
    assert P.continuation_path == "/v1/chat/completions"
    assert doc["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "list"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a b"},
        {"role": "assistant", "content": "Hello", "reasoning": "hmm "},
    ]
    assert doc["tools"] == [{"type": "function", "function": {
        "name": "ls", "description": "list", "parameters": {"type": "object"}}}]
    assert (doc["model"], doc["max_tokens"], doc["temperature"], doc["priority"]) == (
        "served", 47, 0.2, 2)
    assert doc["continue_final_message"] is True and doc["add_generation_prompt"] is False
    assert doc["stream"] is True and doc["stream_options"] == {"include_usage": True}
    assert doc["reasoning_effort"] == "low" and doc["tool_choice"] == "auto"
    assert doc["parallel_tool_calls"] is False
    for gone in ("input", "instructions", "store", "include", "max_output_tokens", "reasoning",
                 "request_id"):
        assert gone not in doc
    forced = body(tool_choice={"type": "function", "name": "ls"}, tools=b.doc["tools"])
    doc = orjson.loads(P.continuation_body(forced, "served", point))
    assert doc["tool_choice"] == {"type": "function", "function": {"name": "ls"}}
    assert "max_tokens" not in doc  # the client set no max_output_tokens
    hosted = body(tool_choice={"type": "web_search"}, tools=b.doc["tools"])
    assert orjson.loads(P.continuation_body(hosted, "served", point))["tool_choice"] == "auto"


def payloads(out: bytes) -> list[dict]:
    return [orjson.loads(line[6:]) for line in out.split(b"\n") if line.startswith(b"data: ")]


def test_splice_continues_the_item_numbering_and_sums_usage() -> None:
    b = body()
    codec, relayed = opened_stream(b)
    point = P.resume_point(b, relayed)
    splice = codec.continuation(point, [3])
    assert splice.event(chunk(role="assistant", content="")) == (SKIP, b"")
    first = chunk(" world")  # the healed tail " wor" comes back whole: "ld" is new
    verdict, out = splice.event(first)
    assert verdict == CONTENT
    [d] = payloads(out)
    assert d == {"type": "response.output_text.delta", "sequence_number": 9,
                 "item_id": "msg_1", "output_index": 1, "content_index": 0, "delta": "ld",
                 "logprobs": []}
    assert first.data is not None and orjson.loads(first.data) == d  # relayed keeps it
    assert splice.event(chunk("!", finish="stop"))[0] == CONTENT
    last = Usage(20, 5, 4)
    usage_chunk = SSEEvent(orjson.dumps({"id": "c", "choices": [], "usage": {
        "prompt_tokens": 20, "completion_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 4}}}))
    verdict, out = splice.event(usage_chunk)
    assert verdict == DONE
    docs = payloads(out)
    assert [x["type"] for x in docs] == [
        "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed"]
    assert [x["sequence_number"] for x in docs] == [11, 12, 13, 14]
    assert docs[0]["text"] == "Hello world!" and docs[1]["part"]["text"] == "Hello world!"
    assert docs[2]["item"]["id"] == "msg_1" and docs[2]["item"]["status"] == "completed"
    resp = docs[3]["response"]
    total = summed_usage(last, [3])
    # the engine's id ("resp_1") is the gateway's to the client
    assert resp["id"] == b.ext.response_id
    assert resp["model"] == "client" and resp["status"] == "completed"
    assert [i["id"] for i in resp["output"]] == ["rs_1", "msg_1"]
    assert resp["output"][1]["content"][0]["text"] == "Hello world!"
    assert resp["usage"]["input_tokens"] == total.prompt == 37  # 20 + (20 - 3 carried)
    assert resp["usage"]["output_tokens"] == total.completion == 8
    assert resp["usage"]["input_tokens_details"] == {"cached_tokens": 4}
    assert splice.usage == total and splice.final == resp and codec.final == resp


def test_a_second_resume_continues_from_the_splice() -> None:
    b = body()
    codec, relayed = opened_stream(b)
    splice = codec.continuation(P.resume_point(b, relayed), [3])
    again = chunk(" world and")
    assert splice.event(again)[0] == CONTENT
    assert again.data is not None
    relayed.append(again.data)
    point = P.resume_point(b, relayed)
    assert point.text == "Hello world and" and point.blocker is None
    assert splice.resume_blocker(point) is None
    second = splice.continuation(point, [3, 2])
    _, out = second.event(chunk(" and more", finish="length"))
    assert payloads(out)[0]["delta"] == " more" and payloads(out)[0]["sequence_number"] == 10
    out = second.event(SSEEvent(b"[DONE]"))[1]
    resp = payloads(out)[-1]["response"]
    assert resp["status"] == "incomplete"
    assert resp["incomplete_details"] == {"reason": "max_output_tokens"}
    assert resp["output"][1]["content"][0]["text"] == "Hello world and more"


def test_splice_divergence_and_tool_calls_are_errors() -> None:
    b = body()
    codec, relayed = opened_stream(b)
    splice = codec.continuation(P.resume_point(b, relayed), [3])
    assert isinstance(splice, ResponsesSplice)
    verdict, out = splice.event(chunk(" wander"))
    assert verdict == ERROR and splice.diverged is True
    assert payloads(out)[0]["type"] == "error" and payloads(out)[0]["sequence_number"] == 9
    splice = codec.continuation(P.resume_point(b, relayed), [3])
    assert splice.event(chunk(tool_calls=[{"index": 0}]))[0] == ERROR


def test_head_kind_reads_a_continuations_chat_chunks() -> None:
    assert P.head_kind(chunk(role="assistant", content="")) == (HEAD_FRAME, None)
    assert P.head_kind(chunk("x")) == (HEAD_CONTENT, None)
    assert P.head_kind(ev("response.created", 0, response=RESP))[0] == HEAD_FRAME
    assert P.codec(body(), REWRITE).event(ev("response.created", 0, response=RESP))[0] == FRAME


def test_continuation_carries_the_expanded_previous_turns() -> None:
    """With ``previous_response_id`` expanded by the gateway (``Turn.full_input``) the
    continuation's conversation holds the earlier turns, not only this request's input."""
    b = body(previous_response_id="resp_0", input="and then?")
    b.ext.full_input = [
        {"type": "message", "role": "user", "content": "first"},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "answer one"}]},
        {"type": "message", "role": "user", "content": "and then?"},
    ]
    _, relayed = opened_stream(b)
    doc = orjson.loads(P.continuation_body(b, "served", P.resume_point(b, relayed)))
    assert [m["content"] for m in doc["messages"]] == [
        "first", "answer one", "and then?", "Hello"]
    assert "previous_response_id" not in doc


def test_a_continuation_broken_after_its_finish_is_ended_not_continued() -> None:
    """The continuation's finish reason came, then its replica broke before the usage chunk:
    the splice says it finished (the relay then ends the stream instead of asking a second
    continuation to go past the end) and ends the response with the usage given (the
    gateway's estimate), stored as ``final``."""
    b = body()
    codec, relayed = opened_stream(b)
    splice = codec.continuation(P.resume_point(b, relayed), [3])
    assert not splice.finished() and splice.ending(Usage(30, 9, 0), relayed) is None
    assert splice.event(chunk(" world!", finish="stop"))[0] == CONTENT
    assert splice.finished()
    out = splice.ending(Usage(30, 9, 0), relayed)
    assert out is not None
    docs = payloads(out)
    assert [x["type"] for x in docs][-1] == "response.completed"
    assert [x["sequence_number"] for x in docs] == [10, 11, 12, 13]
    resp = docs[-1]["response"]
    assert resp["status"] == "completed"
    assert resp["output"][1]["content"][0]["text"] == "Hello world!"
    assert resp["usage"]["input_tokens"] == 30 and resp["usage"]["output_tokens"] == 9
    assert codec.final == resp


def test_continuation_keeps_the_images_of_the_input() -> None:
    """An ``input_image`` part is carried to the chat continuation as ``image_url`` (it was
    dropped: the continuation went on from a conversation without the image the model saw)."""
    url = "data:image/png;base64,iVBORw0KGgo="
    b = body(input=[{"role": "user", "content": [
        {"type": "input_text", "text": "what is this?"},
        {"type": "input_image", "image_url": url, "detail": "low"}]}])
    _, relayed = opened_stream(b)
    doc = orjson.loads(P.continuation_body(b, "served", P.resume_point(b, relayed)))
    assert doc["messages"][0] == {"role": "user", "content": [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": url, "detail": "low"}}]}
    text_only = body(input=[{"role": "user", "content": [{"type": "input_text", "text": "a"}]}])
    _, relayed = opened_stream(text_only)
    doc = orjson.loads(P.continuation_body(text_only, "served",
                                           P.resume_point(text_only, relayed)))
    assert doc["messages"][0] == {"role": "user", "content": "a"}
