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
from dataclasses import replace
from typing import Any

from gateway.account import account
from gateway.admit.gate import Gate
from gateway.admit.lent import Lent
from gateway.admit.path import admit_and_plan
from gateway.admit.request import ClientRequest
from gateway.asgi import (
    ClientDisconnected,
    DisconnectWatch,
    Scope,
    read_body,
    send_response,
)
from gateway.errors import GatewayError
from gateway.protocols.base import Protocol, Rewrite
from gateway.relay.answer import end_stream_with_error, finish_first, usage_headers
from gateway.relay.assembled import assemble_json
from gateway.relay.keepalive import PrefillKeepalive
from gateway.relay.resume import relay_resumable
from gateway.relay.stream import SSE_HEADERS
from gateway.state import GatewayState
from gateway.telemetry.histograms import GapTimer
from gateway.telemetry.record import RequestRecord
from gateway.upstream.attempt import OpenedResponse
from gateway.upstream.continuation import Resumption
from gateway.upstream.exchange import Exchange
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
        request = ClientRequest.from_scope(scope)
        ex = self._exchange(scope, request, send)
        lent = Lent(self.gate, self.state.admission)
        try:
            # 1-2. admit and plan: the key before the body is read, then the body, limits,
            # band and session budget, the plan restricted to the key's tiers (the picker's too)
            await self._admit(ex, scope, receive, request, lent)
            ex.session_running = self.state.sessions.begin(ex.rec.key_id, ex.rec.session_id)
            final: dict[str, Any] | None = None
            async with DisconnectWatch(receive, scope), self.protocol.running(ex.body,
                                                                              ex.rec) as run:
                # 3. attempt (after a saturated pool's queue), kept alive while silent
                opened = await self._open(ex, lent)
                run.replica = opened.attempt.replica.url
                ex.attempts.append(opened)  # and the continuations of a resumed stream
                try:
                    # 4. relay (a stream that breaks mid-way is resumed on another replica),
                    # the protocol's finish (e.g. store it) before the answer's last bytes
                    ex.response_doc = opened.doc
                    final = await self._respond(ex)
                finally:
                    for each in ex.attempts:
                        each.close()
                        if each.span is not None:
                            each.span.end(ex.rec.outcome or "error", status=ex.rec.status)
            if final is not None and not ex.body.stream:
                ex.response_doc = final
        except ClientDisconnected:
            ex.rec.status, ex.rec.outcome = 499, "client_disconnected"
        except GatewayError as e:
            ex.rec.outcome = ex.rec.outcome or e.code or e.type
            await self._fail(ex, e, lent.headers)
        except Exception:
            log.exception("internal error on request %s", ex.rec.request_id)
            ex.rec.outcome = "internal_error"
            await self._fail(ex, GatewayError("internal gateway error", code="internal_error"), [])
        except asyncio.CancelledError:  # server shutdown past its grace period (uvicorn cancels)
            await self._cut_by_shutdown(ex)
        finally:
            # 5. account, then give back the rate-limit reservation with the actual usage
            await self._finish(ex, lent)

    def _exchange(self, scope: Scope, request: ClientRequest, send: Any) -> Exchange:
        """The request's context: its record (with the session its headers name) and its
        span, continuing the client's trace context."""
        rec = RequestRecord(
            request_id=scope.get("speedgate.request_id", ""),
            path=self.protocol.path,
            operation=self.protocol.operation,
        )
        request.name(rec)  # its session (a subagent's under its parent), its end
        trace = self.state.telemetry.start_request(
            scope["headers"], self.protocol.operation, self.protocol.span_attributes()
        )
        rec.trace_id = trace.trace_id
        return Exchange(self.state, self.protocol, rec, trace, send)

    async def _admit(
        self, ex: Exchange, scope: Scope, receive: Any, request: ClientRequest, lent: Lent
    ) -> None:
        """The caller's key (401 first, before the body is read), the body read (bounded by
        ``server.max_body_bytes``: 413), then ``admit_and_plan`` (``gateway.admit.path``):
        checks, tier and entitlement, limits, band and session budget into ``lent``, the
        plan and KV fit (``ex.parsed``, ``ex.planned``), then the client's timeouts."""
        key = self.gate.check_key(request, ex.rec) if self.gate is not None else None
        request = request.with_body(
            await read_body(scope, receive, self.state.config.server.max_body_bytes))
        ex.raw_size = request.size
        admitted = await admit_and_plan(self.state, self.gate, self.protocol, request, key,
                                        ex.rec, lent)
        ex.parsed, ex.planned, ex.limit_headers = admitted.body, admitted.plan, lent.headers
        ex.timeouts = request.timeouts()

    async def _open(self, ex: Exchange, lent: Lent) -> OpenedResponse:
        """The first attempt that answered (``open_with_failover``), after a slot on the
        plan's first pool: waiting in its queue while it is saturated (band order, fair share)
        or refused (``ex.timeouts`` less the wait). A stream silent for long (queue, prefill)
        is committed and kept alive meanwhile (``ex.started``: errors now in-band)."""
        keepalive = self._keepalive(ex)
        try:
            left_s = await lent.wait(ex.plan, ex.timeouts.total_s, ex.rec)
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

    async def _finish(self, ex: Exchange, lent: Lent) -> None:
        """Account the request (``gateway.account``), then give back what admission lent
        (``Lent.release``: the rate-limit reservation with the actual usage, the pool slot,
        the session budget's hold settled at its cost), even when accounting raised."""
        try:
            await account(self.state, ex)
        finally:
            self.state.sessions.done(ex.session_running)  # when accounting did not
            await lent.release(ex.rec)

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
        send = finish_first(ex.send, codec,
                            lambda final: protocol.finish(ex.body, rec.key_id, final))
        result = await relay_resumable(ex, send, res, codec)
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
        await protocol.finish(ex.body, rec.key_id, doc)  # stored before the client has it
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
