"""``OpenAIStream.event``'s straight path for token chunks (issue 18) gives the bytes the
general path (``ChunkRewriter.chunk`` + ``encode_event``) gives, and steps aside whenever a
byte splice would not be exact."""

from __future__ import annotations

import orjson
import pytest

from gateway.protocols.base import CONTENT
from gateway.protocols.openai_chat import ChunkRewriter, OpenAIStream
from gateway.relay.sse import SSEEvent, encode_event

TOKEN = (b'{"id":"c1","object":"chat.completion.chunk","created":1,"model":"served",'
         b'"choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null}]}')

CHUNKS = {
    "token": TOKEN,
    "role": TOKEN.replace(b'{"content":"Hi"}', b'{"role":"assistant","content":""}'),
    "finish": TOKEN.replace(b'"finish_reason":null', b'"finish_reason":"stop"'),
    "tool call": TOKEN.replace(b'{"content":"Hi"}',
                               b'{"tool_calls":[{"index":0,"function":{"arguments":"{\\"a\\":1}"}}]}'),
    "model text in content": TOKEN.replace(b'"Hi"', b'"\\"model\\":\\"served\\""'),
    "spaced model": TOKEN.replace(b'"model":"served"', b'"model": "served"'),
    "model twice": TOKEN.replace(b'"logprobs":null', b'"logprobs":{"model":"served"}'),
    "other model": TOKEN.replace(b'"model":"served"', b'"model":"other"'),
    "no model": TOKEN.replace(b'"model":"served",', b""),
    "own tier": TOKEN.replace(b'"created":1,', b'"created":1,"service_tier":"auto",'),
    "same tier": TOKEN.replace(b'"created":1,', b'"created":1,"service_tier":"default",'),
    "escaped key": TOKEN.replace(b'"model":"served"', b'"\\u006dodel":"served"'),
    "line break": TOKEN.replace(b',"choices"', b',\n"choices"'),
}


@pytest.mark.parametrize("client", ["cap", "served"])
@pytest.mark.parametrize("name", sorted(CHUNKS))
def test_straight_path_equals_the_general_path(name: str, client: str) -> None:
    data = CHUNKS[name]
    rewriter = ChunkRewriter("served", client, "default")
    expected = encode_event(rewriter.chunk(data, orjson.loads(data)))
    codec = OpenAIStream(ChunkRewriter("served", client, "default"), strip_usage=True)
    verdict, out = codec.event(SSEEvent(data))
    assert verdict == CONTENT
    assert out == expected
    lines = [line[6:] for line in out.split(b"\n") if line.startswith(b"data: ")]
    doc = orjson.loads(b"\n".join(lines))
    assert doc["service_tier"] == "default"
    if "model" in orjson.loads(data) and orjson.loads(data)["model"] == "served":
        assert doc["model"] == client


def test_token_event_steps_aside_when_a_splice_is_not_exact() -> None:
    r = ChunkRewriter("served", "cap", "default")
    for name in ("spaced model", "model twice", "other model", "line break"):
        data = CHUNKS[name]
        assert r.token_event(data, orjson.loads(data)) is None, name
    data = CHUNKS["token"]
    assert r.token_event(data, orjson.loads(data)) == (
        b'data: {"service_tier":"default",' + data[1:].replace(b'"served"', b'"cap"') + b"\n\n"
    )
