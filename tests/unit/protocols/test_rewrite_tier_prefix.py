"""Review finding: ``ChunkRewriter.chunk`` spliced ``{"service_tier":"…",`` over the payload's
first byte, assuming compact JSON with a first key: an event that parses as an object but
starts with whitespace (``data:  {…}``, ``data:\t{…}``) or is ``{}`` reached the client as
invalid JSON. Such payloads are now re-serialised; the compact form is still spliced."""

from __future__ import annotations

import orjson
import pytest

from gateway.common.sse import SSEParser
from gateway.protocols.base import CONTENT
from gateway.protocols.openai.chat import ChunkRewriter, OpenAIStream

CHUNK = b'{"id":"x","model":"served","choices":[{"index":0,"delta":{"content":"a"}}]}'


@pytest.mark.parametrize("raw", [
    b"data:  " + CHUNK + b"\n\n",   # two spaces after the colon: the parser strips one
    b"data:\t" + CHUNK + b"\n\n",   # a tab is not stripped
    b"data: {}\n\n",                # an empty object
], ids=["leading-space", "leading-tab", "empty-object"])
def test_rewritten_chunk_is_valid_json(raw: bytes) -> None:
    """Each payload shape comes out as valid JSON carrying the serving tier."""
    (ev,) = SSEParser().feed(raw)
    codec = OpenAIStream(ChunkRewriter("served", "m", "default"), strip_usage=False)
    verdict, out = codec.event(ev)
    assert verdict == CONTENT
    assert out.startswith(b"data: ") and out.endswith(b"\n\n")
    doc = orjson.loads(out[6:-2])  # fails: b'{"service_tier":"default",{"id":…' / b'{…,}'
    assert doc["service_tier"] == "default"


def test_compact_chunk_is_spliced_byte_for_byte() -> None:
    """vLLM's compact form keeps every other byte as the engine wrote it."""
    (ev,) = SSEParser().feed(b"data: " + CHUNK + b"\n\n")
    codec = OpenAIStream(ChunkRewriter("served", "m", "default"), strip_usage=False)
    _, out = codec.event(ev)
    assert out == (b'data: {"service_tier":"default",' + CHUNK[1:].replace(b'"served"', b'"m"')
                   + b"\n\n")
