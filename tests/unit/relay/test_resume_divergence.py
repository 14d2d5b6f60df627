"""A continuation whose regenerated word comes back otherwise (token healing's divergence:
sampling chose another word) is the healing's doing, not a failure of the replica that sent it
(docs/resilience.md): that replica is neither excluded from the request nor counted for outlier
ejection, so with two replicas, one broken and one healthy, the stream still completes."""

from __future__ import annotations

import asyncio

from aiohttp import web

from tests.e2e.protocol_helpers import parse_events
from tests.unit.upstream.engine_double import chunk, gateway_on, sse

USAGE = {"prompt_tokens": 20, "completion_tokens": 2, "total_tokens": 22}


async def test_a_diverging_continuation_does_not_exclude_its_healthy_replica() -> None:
    continuations: list[int] = []

    async def script(request: web.Request, i: int) -> web.StreamResponse:
        doc = await request.json()
        if not doc.get("continue_final_message"):  # the first attempt breaks after content
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for part in ({"role": "assistant", "content": ""}, {"content": "one"},
                         {"content": " two"}, {"content": " three"}):
                await resp.write(chunk(part))
            await asyncio.sleep(0)
            assert request.transport is not None
            request.transport.abort()  # the replica's connection breaks mid-stream
            return resp
        continuations.append(i)
        if len(continuations) == 1:  # " three" was left out to be regenerated: another word
            return await sse(request, [chunk({"role": "assistant", "content": ""}),
                                       chunk({"content": " banana"}),
                                       chunk({}, finish="stop"), b"data: [DONE]\n\n"])
        return await sse(request, [chunk({"role": "assistant", "content": ""}),
                                   chunk({"content": " four"}), chunk({}, finish="stop"),
                                   chunk(choices=False, usage=USAGE), b"data: [DONE]\n\n"])

    async with gateway_on(script, replicas=2) as bench:
        r = await bench.client.post("/v1/chat/completions", json={
            "model": "m", "stream": True, "messages": [{"role": "user", "content": "count"}]})
        failures = bench.failures()
    assert r.content.endswith(b"data: [DONE]\n\n")
    events = parse_events(r.content.removesuffix(b"data: [DONE]\n\n"))
    text = "".join(doc["choices"][0]["delta"].get("content") or ""
                   for _, doc in events if doc.get("choices"))
    assert text == "one two three four", r.content
    assert not any("error" in doc for _, doc in events)
    broken = bench.seen[0].replica
    assert continuations == [1 - broken, 1 - broken]  # the diverging replica asked again
    assert failures[broken] == 1 and failures[1 - broken] == 0
