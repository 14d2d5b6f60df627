"""Paced streams (one upstream write per event, as an engine decoding token by token: the SSE
parser's one-event path and a stall window moved at every read) through the app on uvloop:
every event relayed, the model rewritten, the stream never cut by a stall limit shorter than
the stream but far above the pace (an unmoved window would cut it after ~8 events), no
reference cycle left."""

from __future__ import annotations

import asyncio
import gc
from collections import Counter

import orjson
import uvloop

from loadtests.raw_engine import Answers
from tests.unit.telemetry.test_gcstats import Call, chat, cycles_found_by_collection, gateway

CHUNKS, PACE, STALL = 30, 0.03, 0.25  # 0.9 s per stream; 220 ms of slack per event


def _events(call: Call) -> list[bytes]:
    body = b"".join(m.get("body", b"") for m in call.sent if m["type"] == "http.response.body")
    return [e for e in body.split(b"\n\n") if e]


async def _paced() -> None:
    timeouts = {"stall_s": STALL, "ttft_s": 5, "total_s": 30}
    async with gateway(Answers("served", CHUNKS, PACE), timeouts) as app:
        await Call(chat(True)).run(app)
        gc.collect()
        gc.disable()
        try:
            calls = [Call(chat(True, stream_options={"include_usage": True})) for _ in range(8)]
            calls += [Call(chat(False)) for _ in range(4)]
            statuses = Counter(await asyncio.gather(*(c.run(app) for c in calls)))
            for _ in range(5):
                await asyncio.sleep(0)
            found = cycles_found_by_collection()
        finally:
            gc.enable()
    assert statuses == Counter({200: 12}), statuses
    for c in calls[:8]:
        evs = _events(c)
        assert evs[-1] == b"data: [DONE]", evs[-3:]
        docs = [orjson.loads(e[6:]) for e in evs[:-1]]
        assert len(docs) == CHUNKS + 1, len(docs)  # the chunks and the usage chunk
        assert all(d["model"] == "m" and d["service_tier"] for d in docs), docs[0]
        assert not any("error" in d for d in docs)
    for c in calls[8:]:
        doc = orjson.loads(_events(c)[0])
        assert doc["model"] == "m" and "error" not in doc, doc
    kinds = Counter(type(o).__qualname__ for o in found)
    assert not found, f"{len(found)} objects in reference cycles: {kinds.most_common(12)}"


def test_paced_streams_relay_whole_without_cycles() -> None:
    """8 streams and 4 assembled answers at once, each of 30 paced events."""
    uvloop.run(_paced())
