"""The relay's stall and deadline timers, with a fake upstream (no sockets)."""

import asyncio

import orjson

from gateway.common.sse import SSEEvent
from gateway.errors import UpstreamTimeout
from gateway.protocols.openai.chat import ChunkRewriter, OpenAIStream
from gateway.relay.stream import StreamLimits, relay_events

ROLE = SSEEvent(b'{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}')
TOKEN = SSEEvent(b'{"model":"s","choices":[{"index":0,"delta":{"content":"a"}}]}')


async def _silent():
    await asyncio.sleep(3600)
    yield []  # pragma: no cover


async def _run(batches, stall_s=0.05, total_in_s=10.0):
    sent: list[bytes] = []

    async def send(msg):
        sent.append(msg["body"])

    loop = asyncio.get_running_loop()
    result = await relay_events(
        send, [ROLE, TOKEN], batches,
        OpenAIStream(ChunkRewriter("s", "m", "default"), strip_usage=True),
        StreamLimits(stall_s, total_in_s, loop.time() + total_in_s),
    )
    return result, sent


async def test_stall_fires_when_nothing_follows_the_head():
    result, sent = await asyncio.wait_for(_run(_silent()), 2)
    assert isinstance(result.error, UpstreamTimeout) and result.error.stage == "stall"
    assert orjson.loads(sent[-1][6:])["error"]["code"] == "upstream_timeout"
    assert b'"model":"m"' in sent[0] and b'"service_tier":"default"' in sent[0]


async def test_total_deadline_beats_a_longer_stall_limit():
    result, _ = await asyncio.wait_for(_run(_silent(), stall_s=60, total_in_s=0.05), 2)
    assert isinstance(result.error, UpstreamTimeout) and result.error.stage == "total"


async def test_steady_batches_reset_the_stall_timer():
    async def steady():
        for _ in range(5):
            await asyncio.sleep(0.03)
            yield [TOKEN]
        yield [SSEEvent(b"[DONE]")]

    result, sent = await _run(steady(), stall_s=0.05)
    assert result.ok and sent[-1] == b"data: [DONE]\n\n"
    assert result.events == 7  # role + 6 tokens; [DONE] is not counted
