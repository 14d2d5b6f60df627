"""The path of one request, top-down: admit → plan → attempt → relay → account.

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
from dataclasses import dataclass, replace
from typing import Any

from gateway.account import account
from gateway.admit.admission import Ticket
from gateway.admit.auth import ApiKey
from gateway.admit.gate import Gate
from gateway.admit.parse import read_checked
from gateway.admit.ratelimit import Reservation
from gateway.admit.session import body_session, derived_session, header_session
from gateway.asgi import (
    ClientDisconnected,
    DisconnectWatch,
    Scope,
    header,
    read_body,
    send_response,
)
from gateway.errors import GatewayError
from gateway.plan.auto.service import choose_auto
from gateway.plan.chain import plan_request
from gateway.plan.kv_fit import fit_replicas
from gateway.protocols.base import Protocol, Rewrite
from gateway.relay.answer import end_stream_with_error, usage_headers
from gateway.relay.assembled import assemble_json
from gateway.relay.keepalive import PrefillKeepalive
from gateway.relay.resume import relay_resumable
from gateway.relay.stream import SSE_HEADERS
from gateway.routing import RouteRequest
from gateway.routing.keys import affinity_id
from gateway.state import GatewayState
from gateway.telemetry.histograms import GapTimer
from gateway.telemetry.record import RequestRecord
from gateway.upstream.attempt import OpenedResponse
from gateway.upstream.continuation import Resumption
from gateway.upstream.deadline import client_timeouts
from gateway.upstream.exchange import Exchange
from gateway.upstream.failover import open_with_failover

log = logging.getLogger("speedgate.handler")


@dataclass(slots=True)
class Held:
    """What admission lent a request, given back on every exit path: the rate-limit
    ``reservation`` and the admission ``ticket`` (pool slot, session budget hold)."""

    reservation: Reservation | None = None
    ticket: Ticket | None = None


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
        ex = self._exchange(scope, send)
        held = Held()
        try:
            # 1. admit (the key before reading the body; limits once the body is known)
            key = await self._read(ex, scope, receive)
            # 2. plan (restricted to the key's tiers), limits, band and session budget
            ticket = await self._plan(ex, scope, key, held)
            final: dict[str, Any] | None = None
            async with DisconnectWatch(receive, scope), self.protocol.running(ex.body,
                                                                              ex.rec) as run:
                # 3. attempt (after a saturated pool's queue), kept alive while silent
                opened = await self._open(ex, ticket)
                run.replica = opened.attempt.replica.url
                ex.attempts.append(opened)  # and the continuations of a resumed stream
                try:
                    # 4. relay (a stream that breaks mid-way is resumed on another replica)
                    ex.response_doc = opened.doc
                    final = await self._respond(ex)
                finally:
                    for each in ex.attempts:
                        each.close()
                        if each.span is not None:
                            each.span.end(ex.rec.outcome or "error", status=ex.rec.status)
            if final is not None:
                ex.response_doc = final if not ex.body.stream else ex.response_doc
                await self.protocol.finish(ex.body, ex.rec.key_id, final)  # e.g. store it
        except ClientDisconnected:
            ex.rec.status, ex.rec.outcome = 499, "client_disconnected"
        except GatewayError as e:
            ex.rec.outcome = ex.rec.outcome or e.code or e.type
            await self._fail(ex, e, ex.limit_headers)
        except Exception:
            log.exception("internal error on request %s", ex.rec.request_id)
            ex.rec.outcome = "internal_error"
            await self._fail(ex, GatewayError("internal gateway error", code="internal_error"), [])
        except asyncio.CancelledError:  # server shutdown past its grace period (uvicorn cancels)
            await self._cut_by_shutdown(ex)
        finally:
            # 5. account, then give back the rate-limit reservation with the actual usage
            await self._finish(ex, held)

    def _exchange(self, scope: Scope, send: Any) -> Exchange:
        """The request's context: its record (with the session its headers name) and its
        span, continuing the client's trace context."""
        rec = RequestRecord(
            request_id=scope.get("speedgate.request_id", ""),
            path=self.protocol.path,
            operation=self.protocol.operation,
        )
        rec.session_id, rec.session_src = header_session(scope)
        trace = self.state.telemetry.start_request(
            scope["headers"], self.protocol.operation, self.protocol.span_attributes()
        )
        rec.trace_id = trace.trace_id
        return Exchange(self.state, self.protocol, rec, trace, send)

    async def _read(self, ex: Exchange, scope: Scope, receive: Any) -> ApiKey | None:
        """The caller's key (401 first, before the body is read), then the body read
        (bounded by ``server.max_body_bytes``: 413) and checked (400 in the API's shape:
        a client's mistake never reaches a replica; large bodies parsed off the loop) into
        ``ex.parsed``; the body's ``prompt_cache_key`` is the session when no header named
        one."""
        cfg, rec = self.state.config.server, ex.rec
        key = self.gate.authenticate(scope, rec) if self.gate is not None else None
        raw = await read_body(scope, receive, cfg.max_body_bytes)
        ex.raw_size = len(raw)
        ex.parsed = await read_checked(self.protocol, raw, cfg.max_json_depth)
        if rec.session_id is None:
            rec.session_id, rec.session_src = body_session(ex.parsed.doc)
        return key

    async def _plan(self, ex: Exchange, scope: Scope, key: ApiKey | None, held: Held) -> Ticket:
        """Tier request and entitlement (403), the protocol's preparation (e.g.
        ``previous_response_id`` expanded: 404), the derived session when none was named
        (``gateway.admit.session``), rate limits before any routing work (429: a refused
        request costs ~0), priority band and session budget (``held.ticket``; past its soft
        share auto takes the cheaper tier), routing keys once (sessions scoped to the API
        key), the auto choice and the plan (``ex.planned``), the client's timeouts. Returns
        the ticket (also in ``held``)."""
        state, gate, protocol, body, rec = self.state, self.gate, self.protocol, ex.body, ex.rec
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
        if gate is not None:
            held.reservation, ex.limit_headers = await gate.reserve(key, body, protocol,
                                                                    ex.raw_size)
        held.ticket = ticket = await state.admission.enter(key, treq, allowed, scope, body,
                                                           ex.raw_size, rec)
        ex.limit_headers = ex.limit_headers + ticket.headers()
        # auto weighs each pool's live estimate for this request
        route = RouteRequest.from_doc(
            body.conversation, affinity_id(rec.session_id, rec.session_src, body.session_hint),
            scope=rec.key_id,
        )
        choice = await choose_auto(state.auto, treq, route, body.conversation, allowed,
                                   ticket.over_soft_budget)
        plan = ex.planned = plan_request(treq, state.pools, allowed, choice)
        plan.route, rec.auto_choice = route, plan.auto
        # only replicas whose context and KV pool hold it; fits none: refused now
        await fit_replicas(plan, route, body, ex.raw_size, protocol,
                           state.config.telemetry.usage_estimate_encoding)
        plan.engine_priority = ticket.engine_priority
        ex.timeouts = client_timeouts(
            header(scope, b"x-speedgate-timeout"),
            header(scope, b"x-stainless-timeout"),
            header(scope, b"x-stainless-read-timeout"),
        )
        rec.model, rec.asked_tier, rec.stream = treq.model_name, treq.tier, body.stream
        return ticket

    async def _open(self, ex: Exchange, ticket: Ticket) -> OpenedResponse:
        """The first attempt that answered (``open_with_failover``), after a slot on the
        plan's first pool: waiting in its queue while it is saturated (band order, fair share)
        or refused (``ex.timeouts`` less the wait). A stream silent for long (queue, prefill)
        is committed and kept alive meanwhile (``ex.started``: errors now in-band)."""
        keepalive = self._keepalive(ex)
        try:
            left_s = await self.state.admission.wait(ticket, ex.plan, ex.timeouts.total_s,
                                                     ex.rec)
            ex.timeouts = replace(ex.timeouts, total_s=left_s)
            return await open_with_failover(
                ex, heartbeat=keepalive.heartbeat if keepalive is not None else None)
        finally:
            if ex.plan.route is not None:  # moved or waited for KV room (the access log)
                ex.rec.kv_placement = ex.plan.route.kv_placement
                ex.rec.kv_figures = ex.plan.route.kv_figures
            if keepalive is not None and await keepalive.stop():
                ex.started, ex.rec.status = True, 200

    async def _fail(
        self, ex: Exchange, err: GatewayError, extra: list[tuple[bytes, bytes]]
    ) -> None:
        """Answer ``err``: its status and body in the protocol's shape (with ``extra``
        headers) before the response started; one in-band error event on a started stream;
        nothing more on a JSON answer already sent."""
        if not ex.started:
            ex.rec.status = self.protocol.errors.status(err)
            await self._send_error(ex, err, extra)
        elif ex.parsed is not None and ex.parsed.stream:
            await end_stream_with_error(ex.send, self.protocol, ex.codecs, err)

    async def _finish(self, ex: Exchange, held: Held) -> None:
        """Account the request (``gateway.account``), then give back the rate-limit
        reservation with the actual usage, the pool slot, and the session budget's hold
        settled at its cost: each even when the one before raised."""
        try:
            await account(self.state, ex)
        finally:
            try:
                if held.reservation is not None and self.gate is not None:
                    await self.gate.release(held.reservation, ex.rec)
            finally:
                await self.state.admission.leave(held.ticket, ex.rec)

    async def _cut_by_shutdown(self, ex: Exchange) -> None:
        """Documented behaviour, not a failure: past ``server.graceful_shutdown_s`` uvicorn
        cancels the requests still open. Each is answered (503 ``shutdown`` before headers, one
        in-band error event of the protocol's kind on a started stream), logged on one WARNING
        line, and returns, so the server logs no traceback; the task's cancellation is
        consumed."""
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        ex.rec.outcome = ex.rec.outcome or "shutdown"
        err = GatewayError("gateway shutting down", status=503, code="shutdown", retry_after_s=1)
        try:
            await self._fail(ex, err, [])
        except Exception:
            pass  # the client may be gone already
        log.warning("request %s cut short by shutdown (server.graceful_shutdown_s passed)",
                    ex.rec.request_id)

    async def _respond(self, ex: Exchange) -> dict[str, Any] | None:
        """Answer the client from ``ex.attempts[0]`` (a stream's continuations are appended);
        the final response object sent (JSON body, or the stream's last one where the
        protocol has it; ``{}`` for a stream without one), or None when the stream failed."""
        if not ex.body.stream:
            return await self._respond_json(ex)
        protocol, rec, opened = self.protocol, ex.rec, ex.attempts[0]
        headers = self._answer_headers(ex, opened)
        headers.append((b"x-speedgate-ttft-s", f"{opened.ttft_s:.4f}".encode()))
        assert opened.head is not None and opened.batches is not None
        codec = protocol.codec(ex.body, self._rewrite(ex, opened))
        ex.codecs.append(codec)
        committed = ex.started  # by the keep-alive of a silent prefill: headers sent
        ex.started, rec.status = True, 200
        if not committed:
            await ex.send({"type": "http.response.start", "status": 200,
                           "headers": SSE_HEADERS + headers})
        rec.itl = GapTimer()
        att = opened.attempt
        res = Resumption(ex.plan, att.deadline, att.total_s, att.read_s)
        result = await relay_resumable(ex, ex.send, res, codec)
        await ex.send({"type": "http.response.body", "body": b"", "more_body": False})
        rec.usage = result.usage
        if result.ok:
            rec.outcome = "ok"
            return codec.final if codec.final is not None else {}
        assert result.error is not None
        rec.outcome = result.error.code
        return None

    async def _respond_json(self, ex: Exchange) -> dict[str, Any]:
        """A JSON answer: the engine's JSON body, or one assembled from its stream
        (``assemble_json``; resumed or asked again: the pool and replica that finished it
        name the headers), rewritten for the client with its usage headers."""
        protocol, rec, opened = self.protocol, ex.rec, ex.attempts[0]
        doc, elapsed_s = opened.doc, opened.ttft_s
        if doc is None:  # a JSON answer assembled from the engine's stream
            doc, elapsed_s = await assemble_json(ex, self._rewrite(ex, opened))
        last = ex.attempts[-1]
        headers = self._answer_headers(ex, last)
        rec.usage = protocol.json_usage(doc)
        headers += usage_headers(rec.usage, last.attempt.pool.config.prices, elapsed_s, rec.flex)
        payload = protocol.rewrite_json(doc, ex.body, self._rewrite(ex, last))
        ex.started, rec.status, rec.outcome = True, 200, "ok"
        await send_response(ex.send, 200, payload, headers)
        return doc

    @staticmethod
    def _rewrite(ex: Exchange, opened: OpenedResponse) -> Rewrite:
        """How the answer of ``opened``'s pool is rewritten for the client (the model name it
        asked for, the tier that served, flex)."""
        pool = opened.attempt.pool
        return Rewrite(pool.config.served_model_name, ex.plan.request.model_name, pool.tier,
                       flex=ex.rec.flex)

    def _answer_headers(self, ex: Exchange, opened: OpenedResponse) -> list[tuple[bytes, bytes]]:
        """The headers of an answer served by ``opened``: request id, tier, fallback, auto
        reason, queue wait, the limit headers and the replica's name."""
        return [*self._headers(ex.rec), *ex.limit_headers,
                (b"x-speedgate-replica", opened.attempt.replica.name.encode())]

    def _keepalive(self, ex: Exchange) -> PrefillKeepalive | None:
        """The armed keep-alive of a stream request (``gateway.relay.keepalive``), per the
        first pool's ``timeouts.keepalive_after_s`` (None: off) and ``keepalive_interval_s``;
        None for a JSON answer."""
        timeouts = ex.plan.chain[0].config.timeouts
        if not ex.body.stream or timeouts.keepalive_after_s is None:
            return None
        keepalive = PrefillKeepalive(ex.send,
                                     SSE_HEADERS + self._headers(ex.rec) + ex.limit_headers,
                                     self.protocol.keepalive, timeouts.keepalive_after_s,
                                     timeouts.keepalive_interval_s)
        keepalive.arm()
        return keepalive

    async def _send_error(
        self, ex: Exchange, err: GatewayError, extra: list[tuple[bytes, bytes]]
    ) -> None:
        """The error response of ``err`` in the protocol's shape, with ``extra`` headers."""
        shape = self.protocol.errors
        headers = self._headers(ex.rec) + extra + shape.headers(err)
        await send_response(ex.send, shape.status(err), shape.body(err, ex.rec.request_id), headers)

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
