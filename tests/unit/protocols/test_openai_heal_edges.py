"""Token healing's edges in mid-stream resume (``OpenAISplice``, ``resume_point``,
``continuation_body``): found by a review that tried to break it, one rule per test."""

from __future__ import annotations

import orjson

from gateway.common.sse import SSEEvent
from gateway.common.usage import Usage
from gateway.protocols.base import CONTENT, ERROR, SKIP, Rewrite
from gateway.protocols.openai.assemble import assemble
from gateway.protocols.openai.chat import ChatProtocol, CompletionsProtocol
from gateway.protocols.openai.splice import summed_usage
from gateway.telemetry.tokencount import count_text

REWRITE = Rewrite("served", "client", "standard")


def chunk(delta: dict, finish: str | None = None, logprobs=None, **top) -> bytes:
    return orjson.dumps({"id": top.pop("id", "chatcmpl-a"), "object": "chat.completion.chunk",
                         "created": 7, "model": "served", "choices": [
                             {"index": 0, "delta": delta, "logprobs": logprobs,
                              "finish_reason": finish}], **top})


def chat_body(**doc):
    raw = orjson.dumps({"model": "client", "messages": [{"role": "user", "content": "hi"}],
                        "stream": True, **doc})
    return ChatProtocol().parse(raw)


def out_doc(out: bytes) -> dict:
    return orjson.loads(out[6:].strip())


def splice_for(body, relayed: list[bytes], proto=None):
    proto = proto or ChatProtocol()
    point = proto.resume_point(body, relayed)
    return point, proto.codec(body, REWRITE).continuation(point, [point.tokens])


# A finish other than "length" before the whole tail came back: the engine ended where the
# client's text goes on -- a divergence, like another word (else: an answer cut mid-word).
def test_stop_before_the_healed_tail_came_back_is_a_divergence() -> None:
    point, splice = splice_for(chat_body(), [chunk({"content": "The answer is 4.\n"})])
    assert point.heal == "\n"  # the continuation's prompt ends at "The answer is 4."
    verdict, _ = splice.event(SSEEvent(data=chunk({}, finish="stop", id="chatcmpl-b")))
    assert verdict == ERROR and splice.diverged  # got: CONTENT, finish "stop" relayed


def test_stop_after_part_of_the_healed_tail_is_a_divergence() -> None:
    _, splice = splice_for(chat_body(), [chunk({"content": "the fast lane"})])
    assert splice.event(SSEEvent(data=chunk({"content": " la"}, id="chatcmpl-b")))[0] == SKIP
    verdict, _ = splice.event(SSEEvent(data=chunk({}, finish="stop", id="chatcmpl-b")))
    assert verdict == ERROR and splice.diverged  # " la"+EOS is not the " lane" relayed


# A token straddling the healed tail's end (" l" from the first attempt, " lane" again): its
# entry is cut to what the client did not have, so the logprob tokens still spell the text.
def test_logprob_tokens_still_spell_the_text_after_healing() -> None:
    body = chat_body(logprobs=True)
    lp1 = {"content": [{"token": "the", "logprob": -0.1, "top_logprobs": []},
                       {"token": " fast", "logprob": -0.1, "top_logprobs": []},
                       {"token": " l", "logprob": -0.1, "top_logprobs": []}]}
    relayed = [chunk({"content": "the fast l"}, logprobs=lp1)]
    _, splice = splice_for(body, relayed)
    lp2 = {"content": [{"token": " lane", "logprob": -0.2, "top_logprobs": []}]}
    ev = SSEEvent(data=chunk({"content": " lane"}, logprobs=lp2, id="chatcmpl-b"))
    verdict, _ = splice.event(ev)
    assert verdict == CONTENT
    relayed.append(ev.data)
    doc = assemble(relayed, None, chat=True)
    text = doc["choices"][0]["message"]["content"]
    tokens = "".join(e["token"] for e in doc["choices"][0]["logprobs"]["content"])
    assert text == "the fast lane"
    assert tokens == text


# Legacy completions: the continuation's text_offset counts from its own output (vLLM's
# previous_text_lens starts at 0): shifted by the carried text's length.
def test_completions_text_offset_continues_after_the_relayed_text() -> None:
    proto = CompletionsProtocol()
    body = proto.parse(b'{"model": "client", "prompt": "Once", "stream": true, "logprobs": 1}')
    first = orjson.dumps({"id": "cmpl-1", "created": 1, "choices": [{"index": 0,
        "text": " upon a", "logprobs": {"tokens": [" upon", " a"], "token_logprobs": [-1, -1],
                                         "top_logprobs": [{}, {}], "text_offset": [0, 5]},
        "finish_reason": None}]})
    point, splice = splice_for(body, [first], proto)
    assert point.heal == " a"
    cont = orjson.dumps({"id": "cmpl-2", "created": 2, "choices": [{"index": 0,
        "text": " a time", "logprobs": {"tokens": [" a", " time"], "token_logprobs": [-1, -1],
                                        "top_logprobs": [{}, {}], "text_offset": [0, 2]},
        "finish_reason": None}]})
    verdict, out = splice.event(SSEEvent(data=cont))
    lp = out_doc(out)["choices"][0]["logprobs"]
    assert verdict == CONTENT and lp["tokens"] == [" time"]
    assert lp["text_offset"] == [7]


# vLLM versions whose DeltaMessage copies ``reasoning`` into ``reasoning_content`` send both
# keys with the same text: read once, healed in both.
def test_reasoning_sent_under_both_keys_is_read_once_and_healed_in_both() -> None:
    both = {"reasoning": "think hard", "reasoning_content": "think hard"}
    body = chat_body()
    point = ChatProtocol().resume_point(body, [chunk(both)])
    assert point.reasoning == "think hard"


def test_reasoning_sent_under_both_keys_is_healed_in_both() -> None:
    both = {"reasoning": "think hard", "reasoning_content": "think hard"}
    body = chat_body()
    _, splice = splice_for(body, [chunk(both)])
    cont = {"reasoning": " hard now", "reasoning_content": " hard now"}
    verdict, out = splice.event(SSEEvent(data=chunk(cont, id="chatcmpl-b")))
    delta = out_doc(out)["choices"][0]["delta"]
    assert verdict == CONTENT and delta["reasoning"] == " now"
    assert delta["reasoning_content"] == " now"


# A client prefill (its own final assistant message, continue_final_message) with reasoning
# relayed: the continuation carries the reasoning too.
def test_client_prefill_continuation_carries_the_relayed_reasoning() -> None:
    body = chat_body(continue_final_message=True, add_generation_prompt=False,
                     messages=[{"role": "user", "content": "hi"},
                               {"role": "assistant", "content": "Sure:"}])
    point = ChatProtocol().resume_point(body, [chunk({"reasoning": "let me think"})])
    assert point.heal_field == "reasoning" and point.heal == " think"
    up = orjson.loads(ChatProtocol().continuation_body(body, "served", point))
    assert up["messages"][-1].get("reasoning") == "let me"


# vLLM's chat ``echo`` prepends the last message when it has the answer's role: in a
# continuation, the carried text would come again. Not resumed (rule "echo").
def test_chat_echo_is_not_resumed() -> None:
    point = ChatProtocol().resume_point(chat_body(echo=True), [chunk({"content": "the fast l"})])
    assert point.blocker == "echo"


# Usage is the sum of the attempts: both generated the healed tail, so a length-limited
# answer reports max_tokens plus the tail's tokens (docs/resilience.md, "Token healing").
def test_summed_completion_tokens_count_the_tail_twice() -> None:
    body = chat_body(max_tokens=20, stream_options={"include_usage": True})
    relayed = [chunk({"content": "one two three four five six seven eight nine"})]
    point = ChatProtocol().resume_point(body, relayed)
    up = orjson.loads(ChatProtocol().continuation_body(body, "served", point))
    limit = up["max_tokens"]
    assert limit == 20 - point.tokens + count_text(point.heal)
    # the continuation runs to its limit (finish "length"); the engine reports `limit` tokens
    total = summed_usage(Usage(30, limit, 0), [point.tokens])
    assert total.completion == 20 + count_text(point.heal)


# ---- the rules that held -----------------------------------------------------------------

def test_tail_with_finish_in_one_chunk_and_tail_split_over_chunks() -> None:
    _, splice = splice_for(chat_body(), [chunk({"content": "the fast la"})])
    assert splice.event(SSEEvent(data=chunk({"role": "assistant", "content": ""})))[0] == SKIP
    assert splice.event(SSEEvent(data=chunk({"content": " "})))[0] == SKIP
    assert splice.event(SSEEvent(data=chunk({"content": "l"})))[0] == SKIP
    verdict, out = splice.event(SSEEvent(data=chunk({"content": "a"}, finish="stop")))
    choice = out_doc(out)["choices"][0]
    assert verdict == CONTENT and choice["finish_reason"] == "stop"
    assert "content" not in choice["delta"] and "role" not in choice["delta"]


def test_cjk_emoji_tail() -> None:
    _, splice = splice_for(chat_body(), [chunk({"content": "好 速度门😀"})])
    verdict, out = splice.event(SSEEvent(data=chunk({"content": " 速度门😀🎉"})))
    assert verdict == CONTENT and out_doc(out)["choices"][0]["delta"]["content"] == "🎉"


def test_usage_in_the_tail_chunk_without_client_usage() -> None:
    body = chat_body()  # no include_usage: stripped
    _, splice = splice_for(body, [chunk({"content": "a b"})])
    data = chunk({"content": " b"}, usage={"prompt_tokens": 5, "completion_tokens": 1,
                                             "total_tokens": 6})
    verdict, out = splice.event(SSEEvent(data=data))
    assert verdict == CONTENT and "usage" not in out_doc(out)
    assert splice.usage is not None
