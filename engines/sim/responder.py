"""Turn a request's deliveries (``(choice, new tokens, finished)``) into vLLM responses.

Streaming: role chunk per choice (chat), content/tool-call events as tokens arrive (the last
event of a choice carries ``finish_reason``), the usage chunk (``"choices": []``) when
``stream_options.include_usage``, then ``data: [DONE]``. Non-streaming: wait for every choice,
answer one JSON body.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web

from engines.sim import protocol as P
from engines.sim.plans import Plan
from engines.sim.request import RequestContext
from engines.sim.sse import MALFORMED, ConnectionReset, ErrorEventSent, EventWriter

Deliveries = AsyncIterator[list[tuple[int, int, bool]]]
#: One typed SSE event of the Responses / Messages APIs: (event type, JSON payload, counts as
#: content for the fault counters).
Event = tuple[bytes, bytes, bool]
SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}


def delivered_events(
    plan: Plan, items: list[tuple[str, str]], done: bool
) -> list[tuple[str, str]]:
    """Events for newly delivered ``items``: scripted items one each, model text (reasoning,
    content) coalesced per run of one kind; a finished choice with nothing new gets one empty
    content item."""
    if plan.scripted:
        evs = list(items)
    else:
        evs = []
        for kind, t in items:
            if not t:
                continue
            if evs and evs[-1][0] == kind:
                evs[-1] = (kind, evs[-1][1] + t)
            else:
                evs.append((kind, t))
    if done and not evs:
        evs.append(("c", ""))
    return evs


class _Builder:
    """Builds chunk payloads for one streamed request."""

    def __init__(self, ctx: RequestContext) -> None:
        self.ctx = ctx
        so = ctx.body.get("stream_options") or {}
        self.include_usage = bool(so.get("include_usage")) if isinstance(so, dict) else False
        self.continuous = self.include_usage and bool(so.get("continuous_usage_stats"))
        self.call_ids: dict[int, str] = {}
        self.chunk = P.chat_chunk if ctx.chat else P.text_chunk

    def _usage(self) -> dict[str, Any] | None:
        return self.ctx.usage() if self.continuous else None

    def role(self, index: int) -> bytes:
        ctx = self.ctx
        choice = P.delta_choice(index, {"role": "assistant", "content": ""})
        return P.chat_chunk(ctx.rid, ctx.created, ctx.model, [choice], self._usage())

    def event(self, index: int, kind: str, text: str, finish: str | None) -> bytes:
        ctx = self.ctx
        if not ctx.chat:
            choice = P.text_choice(index, text, finish)
        elif kind == "c":
            choice = P.delta_choice(index, {"content": text}, finish)
        elif kind == "r":  # vLLM's reasoning parser output (``reasoning``, 0.32's field)
            choice = P.delta_choice(index, {"reasoning": text}, finish)
        elif kind == "h":
            call_id = self.call_ids.setdefault(index, P.random_id("chatcmpl-tool-"))
            choice = P.delta_choice(index, P.tool_call_header(call_id, text), finish)
        else:
            choice = P.delta_choice(index, P.tool_call_args(text), finish)
        return self.chunk(ctx.rid, ctx.created, ctx.model, [choice], self._usage())

    def usage_chunk(self) -> bytes:
        ctx = self.ctx
        return self.chunk(ctx.rid, ctx.created, ctx.model, [], ctx.usage())


async def respond_stream(request: web.Request, ctx: RequestContext, deliveries: Deliveries
                         ) -> web.StreamResponse:
    """Stream the response as SSE (see the module docstring)."""
    faults, plans = ctx.faults, ctx.plans
    resp = web.StreamResponse(status=200, headers=SSE_HEADERS)
    await resp.prepare(request)
    w = EventWriter(request, resp, faults)
    b = _Builder(ctx)
    try:
        if faults.ttft_delay_s:
            await w.prefill()
        if ctx.chat:
            for pl in plans:
                await w.event(b.role(pl.index))
        if not w.plain:
            await w.after_content()
        async for out in deliveries:
            for idx, n, done in out:
                pl = plans[idx]
                items = pl.items[pl.pos : pl.pos + n]
                pl.pos += n
                evs = delivered_events(pl, items, done)
                last = len(evs) - 1
                for j, (kind, text) in enumerate(evs):
                    finish = pl.finish if done and j == last else None
                    await w.content(b.event(idx, kind, text, finish))
        if b.include_usage:
            await w.event(b.usage_chunk())
        await w.done()
        await resp.write_eof()
    except ErrorEventSent:
        ctx.reset = True  # not completed
        await resp.write_eof()
    except ConnectionReset:
        ctx.reset = True
    finally:
        await deliveries.aclose()  # type: ignore[attr-defined]
    return resp


async def collect(
    request: web.Request, ctx: RequestContext, deliveries: Deliveries
) -> web.Response | None:
    """Wait for every choice of a non-streamed request, then apply the stream faults to the
    whole body: a stall, an engine error (its HTTP answer, returned), a reset (raises
    ``ConnectionReset``), a malformed body (returned).
    None: answer normally."""
    faults, plans = ctx.faults, ctx.plans
    try:
        if faults.ttft_delay_s:
            await asyncio.sleep(faults.ttft_delay_s)
        async for out in deliveries:
            for idx, n, _done in out:
                plans[idx].pos += n
    finally:
        await deliveries.aclose()  # type: ignore[attr-defined]
    if faults.stall_after_chunks is not None and faults.stall_s:
        await asyncio.sleep(faults.stall_s)
    if faults.error_after_chunks is not None:  # vLLM's full generator: the HTTP error
        body = P.error_body(faults.error_message or "error during generation", faults.error_code,
                            type_=faults.error_type)
        return web.Response(status=faults.error_code, body=body, content_type="application/json")
    if faults.reset_after_chunks is not None:
        ctx.reset = True
        if request.transport is not None:
            request.transport.abort()
        raise ConnectionReset
    if faults.malformed_after_chunks is not None:
        return web.Response(body=MALFORMED[len(b"data: ") :], content_type="application/json")
    return None


async def respond_full(
    request: web.Request, ctx: RequestContext, deliveries: Deliveries
) -> web.Response:
    """Wait for every choice and answer one JSON body; stream faults act on the whole body."""
    faulty = await collect(request, ctx, deliveries)
    if faulty is not None:
        return faulty
    plans = ctx.plans
    if ctx.chat:
        choices = [_chat_choice(pl) for pl in plans]
        body = P.chat_response(ctx.rid, ctx.created, ctx.model, choices, ctx.usage())
    else:
        choices = [P.text_choice(pl.index, "".join(t for _, t in pl.items), pl.finish)
                   | {"prompt_logprobs": None} for pl in plans]
        body = P.text_response(ctx.rid, ctx.created, ctx.model, choices, ctx.usage())
    return web.Response(body=body, content_type="application/json")


def _chat_choice(pl: Plan) -> dict[str, Any]:
    content = "".join(t for k, t in pl.items if k == "c")
    reasoning = "".join(t for k, t in pl.items if k == "r") or None
    name = next((t for k, t in pl.items if k == "h"), None)
    if name is None:
        choice = P.chat_message_choice(pl.index, content, pl.finish)
    else:
        args = "".join(t for k, t in pl.items if k == "a")
        call = {"id": P.random_id("chatcmpl-tool-"), "type": "function",
                "function": {"name": name, "arguments": args}}
        choice = P.chat_message_choice(pl.index, content or None, pl.finish, [call])
    choice["message"]["reasoning"] = reasoning
    return choice


def reasoning_signature(text: str) -> str:
    """An opaque signature of a thinking block / encrypted reasoning (base64 of a SHA-256 of
    the text): clients store it and send it back unread."""
    return base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


async def respond_typed_stream(
    request: web.Request,
    ctx: RequestContext,
    deliveries: Deliveries,
    start: Callable[[], list[Event]],
    delta: Callable[[str, str], list[Event]],
    end: Callable[[], list[Event]],
    error_event: Callable[[str, int, str | None], bytes] | None = None,
    ping: bytes = b": ping\n\n",
) -> web.StreamResponse:
    """Stream an API of typed events (``/v1/responses``, ``/v1/messages``): ``start()``'s
    events, ``delta(kind, text)``'s for every delivered token group, ``end()``'s, with the
    request's faults applied (TTFT delay, counted faults after each content event, a reset
    marking ``ctx.reset``); ``error_event``: the API's in-stream error (``EventWriter``),
    ``ping`` its keep-alive (``prefill_pings_s``)."""
    faults, plan = ctx.faults, ctx.plans[0]
    resp = web.StreamResponse(status=200, headers=SSE_HEADERS)
    await resp.prepare(request)
    w = EventWriter(request, resp, faults, error_event)

    async def write(events: list[Event]) -> None:
        for name, payload, content in events:
            await (w.content(payload, name) if content else w.event(payload, name))

    try:
        if faults.ttft_delay_s:
            await w.prefill(ping)
        await write(start())
        if not w.plain:
            await w.after_content()
        async for out in deliveries:
            for _idx, n, done in out:
                items = plan.items[plan.pos : plan.pos + n]
                plan.pos += n
                for kind, text in delivered_events(plan, items, done):
                    await write(delta(kind, text))
        await write(end())
        await resp.write_eof()
    except ConnectionReset:
        ctx.reset = True
    finally:
        await deliveries.aclose()  # type: ignore[attr-defined]
    return resp
