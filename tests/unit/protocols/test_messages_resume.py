"""Resume of Anthropic Messages streams: the resume point read from the relayed payloads, the
chat-completions continuation body, and the splice of its chunks into the Messages stream."""

from __future__ import annotations

import orjson

from gateway.common.sse import SSEEvent
from gateway.protocols.base import CONTENT, DONE, ERROR, HEAD_CONTENT, HEAD_ERROR, SKIP, ResumePoint
from gateway.protocols.body import ParsedBody
from gateway.protocols.messages.protocol import MessagesProtocol
from gateway.protocols.openai.chat import ChatProtocol
from gateway.protocols.openai.splice import Usage, summed_usage

P = MessagesProtocol()


def body(**doc: object) -> ParsedBody:
    raw = orjson.dumps({"model": "client", "max_tokens": 50, "stream": True,
                        "messages": [{"role": "user", "content": "hi"}], **doc})
    return P.parse(raw)


def delta(index: int, **d: object) -> bytes:
    return orjson.dumps({"type": "content_block_delta", "index": index, "delta": d})


def text(index: int, t: str) -> bytes:
    return delta(index, type="text_delta", text=t)


def chunk(content: str | None = None, finish: str | None = None, **extra: object) -> SSEEvent:
    d = {} if content is None else {"content": content}
    return SSEEvent(orjson.dumps({"id": "c", "choices": [
        {"index": 0, "delta": {**d, **extra}, "finish_reason": finish}]}))


def test_resume_point_of_a_text_block_after_thinking() -> None:
    relayed = [delta(0, type="thinking_delta", thinking="hmm "),
               delta(0, type="signature_delta", signature="sig"),
               text(1, "Hello wor")]
    point = P.resume_point(body(), relayed)
    assert (point.text, point.reasoning, point.blocker, point.id) == (
        "Hello wor", "hmm ", None, "1")
    assert point.heal == " wor" and point.carried() == ("Hello", "hmm ")


def test_resume_point_blockers() -> None:
    tool = orjson.dumps({"type": "content_block_start", "index": 1,
                         "content_block": {"type": "tool_use", "id": "t", "name": "f"}})
    assert P.resume_point(body(), [text(0, "a "), tool]).blocker == "tool-call"
    assert P.resume_point(body(), [delta(0, type="input_json_delta",
                                         partial_json="{")]).blocker == "tool-call"
    assert P.resume_point(body(), [delta(0, type="thinking_delta",
                                         thinking="x")]).blocker == "thinking"
    assert P.resume_point(body(), []).blocker == "protocol"
    fmt = body(output_config={"format": {"type": "json_schema", "schema": {}}})
    assert P.resume_point(fmt, [text(0, "{")]).blocker == "structured-output"


def test_codec_blocks_a_resume_once_the_block_closed_or_the_stop_was_relayed() -> None:
    def frame(kind: str, **doc: object) -> SSEEvent:
        return SSEEvent(orjson.dumps({"type": kind, **doc}), kind.encode())

    codec = P.codec(body(), None)  # type: ignore[arg-type]
    codec.event(frame("content_block_start", index=0, content_block={"type": "text", "text": ""}))
    codec.event(SSEEvent(text(0, "a b")))
    point = P.resume_point(body(), [text(0, "a b")])
    assert codec.resume_blocker(point) is None
    codec.event(frame("content_block_stop", index=0))
    assert codec.resume_blocker(point) == "block-closed"
    codec.event(frame("message_delta", delta={"stop_reason": "end_turn"}, usage={}))
    assert codec.resume_blocker(point) == "finished"


def test_continuation_body_is_vllms_chat_conversion_continuing_the_text() -> None:
    b = body(system="be brief", stop_sequences=["END"], temperature=0,
             cache_salt="s", metadata={"user_id": "u"},
             tools=[{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
             tool_choice={"type": "tool", "name": "f"},
             messages=[{"role": "user", "content": "hi"},
                       {"role": "assistant", "content": [
                           {"type": "thinking", "thinking": "t", "signature": "s"},
                           {"type": "tool_use", "id": "u1", "name": "f", "input": {"a": 1}}]},
                       {"role": "user", "content": [
                           {"type": "tool_result", "tool_use_id": "u1", "content": "ok"}]}])
    point = ResumePoint(text="Hello wor", reasoning="r", heal=" wor", tokens=3)
    doc = orjson.loads(P.continuation_body(b, "served", point, priority=2))
    assert doc["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "reasoning": "t", "tool_calls": [
            {"id": "u1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}]},
        {"role": "tool", "tool_call_id": "u1", "content": "ok"},
        {"role": "assistant", "content": "Hello", "reasoning": "r"}]
    assert doc["continue_final_message"] is True and doc["add_generation_prompt"] is False
    assert doc["max_tokens"] == 50 - (3 - 1)  # the healed word is generated again
    assert doc["stop"] == ["END"] and doc["temperature"] == 0 and doc["cache_salt"] == "s"
    assert doc["tools"][0]["function"]["parameters"] == {"type": "object"}
    assert doc["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert doc["priority"] == 2 and doc["model"] == "served"
    assert "metadata" not in doc and "system" not in doc
    assert doc["stream_options"] == {"include_usage": True}
    # accepted by the chat protocol's own validation
    ChatProtocol().parse(orjson.dumps(doc))


def test_splice_heals_continues_the_block_and_sums_usage() -> None:
    point = ResumePoint(text="Hello wor", heal=" wor", tokens=3, id="1")
    codec = P.codec(body(), None).continuation(point, [3])  # type: ignore[arg-type]
    assert codec.event(chunk("", role="assistant"))[0] == SKIP
    assert codec.event(chunk(" wo"))[0] == SKIP
    ev = chunk("rld!")
    verdict, out = codec.event(ev)
    assert verdict == CONTENT
    # relayed keeps what the client got: a second break reads the whole block's text
    again = P.resume_point(body(), [text(1, "Hello wor"), ev.data])  # type: ignore[list-item]
    assert (again.text, again.id, again.blocker) == ("Hello world!", "1", None)
    assert out.startswith(b"event: content_block_delta\n")
    data = orjson.loads(out.split(b"data: ", 1)[1])
    assert data == {"type": "content_block_delta", "index": 1,
                    "delta": {"type": "text_delta", "text": "ld!"}}  # " world!" less " wor"
    assert codec.event(chunk(None, "stop"))[0] == SKIP
    usage = SSEEvent(orjson.dumps({"id": "c", "choices": [], "usage": {
        "prompt_tokens": 12, "completion_tokens": 4, "total_tokens": 16}}))
    verdict, out = codec.event(usage)
    assert verdict == DONE
    names = [ln for ln in out.split(b"\n") if ln.startswith(b"event: ")]
    assert names == [b"event: content_block_stop", b"event: message_delta",
                     b"event: message_stop"]
    summed = summed_usage(Usage(12, 4, 0), [3])
    assert codec.usage == summed
    assert b'"input_tokens":%d' % summed.prompt in out and b'"stop_reason":"end_turn"' in out


def test_splice_divergence_and_tool_calls_are_errors() -> None:
    point = ResumePoint(text="Hello wor", heal=" wor", tokens=3, id="0")
    codec = P.codec(body(), None).continuation(point, [3])  # type: ignore[arg-type]
    assert codec.event(chunk(" xy"))[0] == ERROR and codec.diverged  # type: ignore[attr-defined]
    codec = P.codec(body(), None).continuation(point, [3])  # type: ignore[arg-type]
    call = chunk(None, tool_calls=[{"index": 0, "function": {"name": "f"}}])
    assert codec.event(call)[0] == ERROR


def test_head_kind_reads_a_continuations_chat_chunks() -> None:
    assert P.head_kind(chunk("a"))[0] == HEAD_CONTENT
    kind, err = P.head_kind(SSEEvent(b'{"error": {"message": "boom", "code": 500}}'))
    assert kind == HEAD_ERROR and err is not None
