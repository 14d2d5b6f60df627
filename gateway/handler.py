"""The path of one request, top-down: admit → plan → attempt → relay → account (DESIGN §1).

``ApiRoute`` is a raw ASGI app serving one client API (``/v1/chat/completions``,
``/v1/completions``, ``/v1/responses``, ``/v1/messages``, ``/v1/messages/count_tokens``): no
response models, no per-chunk validation. What differs between APIs is asked of the route's
``Protocol`` (``gateway.protocols``): reading the body, the fields it owns, its stream framing,
usage and errors. Each step calls a small module: ``gate`` (key, entitlements, rate limits),
``admission`` (priority band, session budget, the queue of a saturated pool), ``tiers`` and
``plan`` (tier and fallback chain), ``failover`` (attempts on replicas and pools, with
``attempt`` for one try with staged timeouts), ``relay`` (SSE relay with mid-stream resume:
``relay.resume``; a non-stream chat or completions answer is assembled from the engine's
stream the same way), ``accounting`` (usage, cost, metrics, trace, logs).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any

from gateway.account import account
from gateway.admit.admission import Ticket
from gateway.admit.gate import Gate
from gateway.admit.parse import read_checked
from gateway.admit.ratelimit import Reservation
from gateway.admit.session import body_session, derived_session, header_session
from gateway.asgi import ClientDisconnected, DisconnectWatch, Scope, header, read_body
from gateway.common.usage import Usage
from gateway.config import Prices
from gateway.errors import GatewayError
from gateway.plan.auto.service import choose_auto
from gateway.plan.chain import Plan, plan_request
from gateway.protocols.base import Protocol, Rewrite, StreamCodec
from gateway.protocols.body import ParsedBody
from gateway.relay.assembled import assemble_json
from gateway.relay.keepalive import PrefillKeepalive
from gateway.relay.resume import relay_resumable
from gateway.relay.stream import SSE_HEADERS
from gateway.routing import RouteRequest
from gateway.routing.keys import affinity_id
from gateway.state import GatewayState
from gateway.telemetry.cost import cost_usd
from gateway.telemetry.histograms import GapTimer
from gateway.telemetry.record import RequestRecord
from gateway.telemetry.tracing import RequestTrace
from gateway.upstream.attempt import OpenedResponse
from gateway.upstream.continuation import Resumption
from gateway.upstream.deadline import client_timeouts
from gateway.upstream.failover import open_with_failover

log = logging.getLogger("speedgate.handler")


class ApiRoute:
    """ASGI app for ``POST <protocol.path>``."""

    def __init__(self, state: GatewayState, protocol: Protocol, gate: Gate | None = None) -> None:
        self.state = state
        self.protocol = protocol
        self.gate = gate  # API keys, entitlements, rate limits; None = open gateway
        self.path = protocol.path

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        """Serve one request; every exit path answers the client (or records 499) and is
        accounted once."""
        state, protocol, gate = self.state, self.protocol, self.gate
        rec = RequestRecord(
            request_id=scope.get("speedgate.request_id", ""),
            path=protocol.path,
            operation=protocol.operation,
        )
        rec.session_id, rec.session_src = header_session(scope)
        trace = state.telemetry.start_request(
            scope["headers"], protocol.operation, protocol.span_attributes()
        )
        rec.trace_id = trace.trace_id
        body: ParsedBody | None = None
        relayed: list[bytes] = []
        response_doc: dict[str, Any] | None = None
        raw_size = 0
        reservation: Reservation | None = None
        limit_headers: list[tuple[bytes, bytes]] = []
        codecs: list[StreamCodec] = []  # the stream's codec, once it started
        ticket: Ticket | None = None
        try:
            # 1. admit (the key before reading the body; limits once the body is known)
            key = gate.authenticate(scope, rec) if gate is not None else None
            raw = await read_body(scope, receive, state.config.server.max_body_bytes)
            raw_size = len(raw)
            # a client's mistake never reaches a replica (large bodies parsed off the loop)
            body = await read_checked(protocol, raw, state.config.server.max_json_depth)
            if rec.session_id is None:  # no session header: the body's prompt_cache_key
                rec.session_id, rec.session_src = body_session(body.doc)
            # 2. plan (restricted to the tiers the key is entitled to)
            treq = state.models.resolve(
                body.doc["model"],
                header(scope, b"x-speedgate-tier"),
                protocol.service_tier(body.doc),
                default_only=protocol.default_tier_only,
            )
            allowed = gate.entitle(key, treq, scope, rec) if gate is not None else None
            await protocol.prepare(body, rec.key_id)  # e.g. previous_response_id expanded
            if rec.session_id is None:  # none named: the Responses chain, else the conversation
                rec.session_id, rec.session_src = derived_session(
                    body.chain_root, body.conversation, rec.key_id)
            if gate is not None:  # limits before any routing work (a refused request costs ~0)
                reservation, limit_headers = await gate.reserve(key, body, protocol, raw_size)
            # priority band and session budget (past its soft share auto takes the cheaper tier)
            ticket = await state.admission.enter(key, treq, allowed, scope, body, raw_size, rec)
            limit_headers = limit_headers + ticket.headers()
            # routing keys once (sessions scoped to the API key); auto weighs each pool's live
            # estimate for this request
            conversation = body.conversation
            route = RouteRequest.from_doc(
                conversation, affinity_id(rec.session_id, rec.session_src, body.session_hint),
                scope=rec.key_id,
            )
            choice = await choose_auto(state.auto, treq, route, conversation, allowed,
                                       ticket.over_soft_budget)
            plan = plan_request(treq, state.pools, allowed, choice)
            plan.route, rec.auto_choice = route, plan.auto
            plan.engine_priority = ticket.engine_priority
            timeouts = client_timeouts(
                header(scope, b"x-speedgate-timeout"),
                header(scope, b"x-stainless-timeout"),
                header(scope, b"x-stainless-read-timeout"),
            )
            rec.model, rec.asked_tier, rec.stream = treq.model_name, treq.tier, body.stream
            final: dict[str, Any] | None = None
            async with DisconnectWatch(receive, scope), protocol.running(body, rec) as run:
                # a stream silent for long (queue, prefill) is committed and kept alive
                keepalive = self._keepalive(send, body, plan, rec, limit_headers)
                try:
                    # a saturated pool: wait in its queue (band order, fair share) or be refused
                    left_s = await state.admission.wait(ticket, plan, timeouts.total_s, rec)
                    timeouts = replace(timeouts, total_s=left_s)
                    # 3. attempt
                    opened = await open_with_failover(
                        state, plan, body, protocol, rec, trace, timeouts,
                        heartbeat=keepalive.heartbeat if keepalive is not None else None,
                    )
                finally:
                    if keepalive is not None and await keepalive.stop():
                        rec.response_started, rec.status = True, 200  # errors now in-band
                run.replica = opened.attempt.replica.url
                attempts = [opened]  # and the continuations of a resumed stream
                try:
                    # 4. relay (a stream that breaks mid-way is resumed on another replica)
                    response_doc = opened.doc
                    final = await self._respond(
                        send, plan, attempts, body, rec, trace, relayed, limit_headers, codecs
                    )
                finally:
                    for each in attempts:
                        each.close()
                        if each.span is not None:
                            each.span.end(rec.outcome or "error", status=rec.status)
            if final is not None:
                response_doc = final if not body.stream else response_doc
                await protocol.finish(body, rec.key_id, final)  # e.g. store the response
        except ClientDisconnected:
            rec.status, rec.outcome = 499, "client_disconnected"
        except GatewayError as e:
            rec.outcome = rec.outcome or e.code or e.type
            if not rec.response_started:
                rec.status = protocol.errors.status(e)
                await self._send_error(send, e, rec, limit_headers)
            elif rec.stream:  # e.g. cancelled while streaming: one in-band error event
                await end_stream_with_error(send, protocol, codecs, e)
        except Exception:
            log.exception("internal error on request %s", rec.request_id)
            rec.outcome = "internal_error"
            err = GatewayError("internal gateway error", code="internal_error")
            if not rec.response_started:
                rec.status = protocol.errors.status(err)
                await self._send_error(send, err, rec, [])
            elif rec.stream:  # the stream started: end it with one in-band error event
                await end_stream_with_error(send, protocol, codecs, err)
        except asyncio.CancelledError:  # server shutdown past its grace period (uvicorn cancels)
            await self._cut_by_shutdown(send, rec, codecs)
        finally:
            # 5. account, then give back the rate-limit reservation with the actual usage
            try:
                await account(
                    state,
                    rec,
                    trace,
                    protocol=protocol,
                    doc=body.conversation if body is not None else None,
                    raw_size=raw_size,
                    relayed=relayed,
                    response_doc=response_doc,
                )
            finally:
                try:
                    if reservation is not None and gate is not None:
                        await gate.release(reservation, rec)
                finally:  # the pool slot back, the session's budget settled at its cost
                    await state.admission.leave(ticket, rec)

    async def _cut_by_shutdown(
        self, send: Any, rec: RequestRecord, codecs: list[StreamCodec]
    ) -> None:
        """Documented behaviour, not a failure: past ``server.graceful_shutdown_s`` uvicorn
        cancels the requests still open. Each is answered (503 ``shutdown`` before headers, one
        in-band error event of the protocol's kind on a started stream), logged on one WARNING
        line, and returns, so the server logs no traceback; the task's cancellation is
        consumed."""
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        rec.outcome = rec.outcome or "shutdown"
        err = GatewayError("gateway shutting down", status=503, code="shutdown", retry_after_s=1)
        if not rec.response_started:
            rec.status = self.protocol.errors.status(err)
            try:
                await self._send_error(send, err, rec, [])
            except Exception:
                pass  # the client may be gone already
        elif rec.stream:
            await end_stream_with_error(send, self.protocol, codecs, err)
        log.warning("request %s cut short by shutdown (server.graceful_shutdown_s passed)",
                    rec.request_id)

    async def _respond(
        self,
        send: Any,
        plan: Plan,
        attempts: list[OpenedResponse],
        body: ParsedBody,
        rec: RequestRecord,
        trace: RequestTrace,
        relayed: list[bytes],
        limit_headers: list[tuple[bytes, bytes]],
        codecs: list[StreamCodec],
    ) -> dict[str, Any] | None:
        """Answer the client from ``attempts[0]`` (a stream's continuations are appended);
        the final response object sent (JSON body, or the stream's last one where the
        protocol has it; ``{}`` for a stream without one), or None when the stream failed."""
        protocol = self.protocol
        opened = attempts[0]
        pool = opened.attempt.pool
        rewrite = Rewrite(pool.config.served_model_name, plan.request.model_name, pool.tier,
                          flex=rec.flex)
        headers = self._headers(rec) + limit_headers
        replica = opened.attempt.replica
        headers.append((b"x-speedgate-replica", replica.name.encode()))
        if not body.stream:
            doc, elapsed_s = opened.doc, opened.ttft_s
            if doc is None:  # a JSON answer assembled from the engine's stream
                doc, elapsed_s = await assemble_json(self.state, plan, attempts, body, protocol,
                                                     rec, trace, relayed, rewrite)
                last = attempts[-1].attempt  # resumed: the pool and replica that finished it
                pool = last.pool
                rewrite = Rewrite(pool.config.served_model_name, plan.request.model_name,
                                  pool.tier, flex=rec.flex)
                headers = self._headers(rec) + limit_headers
                headers.append((b"x-speedgate-replica", last.replica.name.encode()))
            rec.usage = protocol.json_usage(doc)
            headers += usage_headers(rec.usage, pool.config.prices, elapsed_s, rec.flex)
            payload = protocol.rewrite_json(doc, body, rewrite)
            rec.response_started, rec.status, rec.outcome = True, 200, "ok"
            await send_json(send, 200, payload, headers)
            return doc
        headers.append((b"x-speedgate-ttft-s", f"{opened.ttft_s:.4f}".encode()))
        assert opened.head is not None and opened.batches is not None
        codec = protocol.codec(body, rewrite)
        codecs.append(codec)
        committed = rec.response_started  # by the keep-alive of a silent prefill: headers sent
        rec.response_started, rec.status = True, 200
        if not committed:
            await send({"type": "http.response.start", "status": 200,
                        "headers": SSE_HEADERS + headers})
        rec.itl = GapTimer()
        att = opened.attempt
        res = Resumption(plan, att.deadline, att.total_s, att.read_s)
        result = await relay_resumable(
            send, self.state, res, attempts, codec,
            body=body, protocol=protocol, rec=rec, trace=trace, relayed=relayed,
        )
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        rec.usage = result.usage
        if result.ok:
            rec.outcome = "ok"
            return codec.final if codec.final is not None else {}
        assert result.error is not None
        rec.outcome = result.error.code
        return None

    def _keepalive(
        self, send: Any, body: ParsedBody, plan: Plan, rec: RequestRecord,
        limit_headers: list[tuple[bytes, bytes]],
    ) -> PrefillKeepalive | None:
        """The armed keep-alive of a stream request (``gateway.relay.keepalive``), per the
        first pool's ``timeouts.keepalive_after_s`` (None: off) and ``keepalive_interval_s``;
        None for a JSON answer."""
        timeouts = plan.chain[0].config.timeouts
        if not body.stream or timeouts.keepalive_after_s is None:
            return None
        keepalive = PrefillKeepalive(send, SSE_HEADERS + self._headers(rec) + limit_headers,
                                     self.protocol.keepalive, timeouts.keepalive_after_s,
                                     timeouts.keepalive_interval_s)
        keepalive.arm()
        return keepalive

    async def _send_error(
        self,
        send: Any,
        err: GatewayError,
        rec: RequestRecord,
        extra: list[tuple[bytes, bytes]],
    ) -> None:
        shape = self.protocol.errors
        headers = self._headers(rec) + extra + shape.headers(err)
        await send_json(send, shape.status(err), shape.body(err, rec.request_id), headers)

    @staticmethod
    def _headers(rec: RequestRecord) -> list[tuple[bytes, bytes]]:
        rid = rec.request_id.encode()
        # ``request-id`` is the header Anthropic's SDKs read; OpenAI's read ``x-request-id``
        out: list[tuple[bytes, bytes]] = [(b"x-request-id", rid), (b"request-id", rid)]
        if rec.served_tier:
            out.append((b"x-speedgate-tier", rec.served_tier.encode()))
        if rec.fallback:
            out.append((b"x-speedgate-fallback", rec.fallback.encode()))
        if rec.auto_reason:
            out.append((b"x-speedgate-auto-reason", rec.auto_reason.encode()))
        if rec.queue_wait_s is not None:  # waited in the gateway queue of a saturated pool
            out.append((b"x-speedgate-queue-wait-s", f"{rec.queue_wait_s:.4f}".encode()))
        return out


async def send_json(
    send: Any, status: int, body: bytes, headers: list[tuple[bytes, bytes]]
) -> None:
    """Send a complete JSON response with ``headers`` (lower-case byte pairs)."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def usage_headers(
    usage: Usage | None, prices: Prices, elapsed_s: float, flex: bool = False
) -> list[tuple[bytes, bytes]]:
    """Per-response accounting headers of a JSON response: tokens, cost (USD; ``flex``: at
    the flex share) and output tokens per second over the upstream time ``elapsed_s``. None
    without usage."""
    if usage is None:
        return []
    out = [
        (b"x-speedgate-prompt-tokens", str(usage.prompt).encode()),
        (b"x-speedgate-cached-tokens", str(usage.cached).encode()),
        (b"x-speedgate-completion-tokens", str(usage.completion).encode()),
        (b"x-speedgate-cost-usd", f"{cost_usd(usage, prices, flex):.8f}".encode()),
    ]
    if elapsed_s > 0:
        rate = f"{usage.completion / elapsed_s:.1f}".encode()
        out.append((b"x-speedgate-output-tokens-per-s", rate))
    return out


async def end_stream_with_error(
    send: Any, protocol: Protocol, codecs: list[StreamCodec], err: GatewayError
) -> None:
    """Best effort: one in-band error event of the protocol's kind (from the stream's codec,
    which numbers events where the protocol does) and the end of a started SSE stream (the
    client may be gone already)."""
    event = codecs[0].error_event(err) if codecs else protocol.error_event(err)
    try:
        await send({"type": "http.response.body", "body": event, "more_body": False})
    except Exception:
        pass
