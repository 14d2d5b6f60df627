"""The path of one request, top-down: admit → plan → attempt → relay → account (DESIGN §1).

``CompletionsEndpoint`` is a raw ASGI app serving ``/v1/chat/completions`` and
``/v1/completions``: no response models, no per-chunk validation. Each step calls a small
module: ``body`` (validate, rewrite owned fields), ``gate`` (key, entitlements, rate limits),
``admission`` (priority band, session budget, the queue of a saturated pool), ``tiers`` and
``plan`` (tier and fallback chain), ``failover`` (attempts on replicas and pools, with
``attempt`` for one try with staged timeouts), ``relay`` (SSE and JSON relay), ``accounting``
(usage, cost, metrics, trace, logs).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any, Literal

from gateway.admit.control import Ticket
from gateway.admit.gate import Gate
from gateway.admit.hardening import check_json_shape
from gateway.admit.params import check_sampling_params
from gateway.admit.ratelimit import Reservation
from gateway.asgi import (
    ClientDisconnected,
    DisconnectWatch,
    Scope,
    header,
    read_body,
    send_error,
    send_response,
)
from gateway.common.ids import bounded_id
from gateway.common.usage import Usage
from gateway.config import Prices
from gateway.errors import GatewayError, UnreadableResponse, UpstreamTimeout
from gateway.plan.auto.service import choose_auto
from gateway.plan.chain import Plan, plan_request
from gateway.plan.tiers import TIER_TO_SERVICE_TIER
from gateway.relay.body import ParsedBody, parse_body
from gateway.relay.stream import SSE_HEADERS, ChunkRewriter, error_event, relay_events
from gateway.routing import RouteRequest
from gateway.state import GatewayState
from gateway.telemetry.accounting import account
from gateway.telemetry.cost import cost_usd
from gateway.telemetry.histograms import GapTimer
from gateway.telemetry.record import RequestRecord
from gateway.upstream.attempt import OpenedResponse
from gateway.upstream.deadline import client_timeouts
from gateway.upstream.failover import open_with_failover

log = logging.getLogger("speedgate.handler")


class CompletionsEndpoint:
    """ASGI app for ``POST /v1/chat/completions`` (``kind="chat"``) and ``/v1/completions``."""

    def __init__(
        self, state: GatewayState, kind: Literal["chat", "completion"], gate: Gate | None = None
    ) -> None:
        self.state = state
        self.kind = kind
        self.gate = gate  # API keys, entitlements, rate limits; None = open gateway
        self.path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        """Serve one request; every exit path answers the client (or records 499) and is
        accounted once."""
        state = self.state
        rec = RequestRecord(request_id=scope.get("speedgate.request_id", ""), path=self.path)
        rec.session_id = session_id_of(scope)
        trace = state.telemetry.start_request(
            scope["headers"], "chat" if self.kind == "chat" else "text_completion"
        )
        rec.trace_id = trace.trace_id
        body: ParsedBody | None = None
        relayed: list[bytes] = []
        response_doc: dict[str, Any] | None = None
        raw_size = 0
        gate = self.gate
        reservation: Reservation | None = None
        ticket: Ticket | None = None
        limit_headers: list[tuple[bytes, bytes]] = []
        try:
            # 1. admit (the key before reading the body; limits once the body is known)
            key = gate.authenticate(scope, rec) if gate is not None else None
            raw = await read_body(scope, receive, state.config.server.max_body_bytes)
            raw_size = len(raw)
            body = parse_body(raw, self.kind)
            check_json_shape(body.doc, state.config.server.max_json_depth)
            check_sampling_params(body.doc)  # a client's mistake never reaches a replica
            # 2. plan (restricted to the tiers the key is entitled to)
            treq = state.models.resolve(
                body.doc["model"], header(scope, b"x-speedgate-tier"), body.doc.get("service_tier")
            )
            allowed = gate.entitle(key, treq, scope, rec) if gate is not None else None
            if gate is not None:  # limits before any routing work (a refused request costs ~0)
                reservation, limit_headers = await gate.reserve(key, body, self.kind, raw_size)
            # priority band and session budget (past its soft share auto takes the cheaper tier)
            ticket = await state.admission.enter(key, treq, allowed, scope, body, raw_size, rec)
            limit_headers = limit_headers + ticket.headers()
            # routing keys once (sessions scoped to the API key); auto weighs each pool's live
            # estimate for this request
            route = RouteRequest.from_doc(body.doc, rec.session_id, scope=rec.key_id)
            choice = await choose_auto(state.auto, treq, route, body.doc, allowed,
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
            async with DisconnectWatch(receive):
                # a saturated pool: wait in its queue (band order, fair share) or be refused
                left_s = await state.admission.wait(ticket, plan, timeouts.total_s, rec)
                timeouts = replace(timeouts, total_s=left_s)
                # 3. attempt
                opened = await open_with_failover(
                    state, plan, body, rec, trace, self.path, timeouts
                )
                try:
                    # 4. relay
                    response_doc = opened.doc
                    await self._respond(send, plan, opened, body, rec, relayed, limit_headers)
                finally:
                    opened.close()
                    if opened.span is not None:
                        opened.span.end(rec.outcome or "error", status=rec.status)
        except ClientDisconnected:
            rec.status, rec.outcome = 499, "client_disconnected"
        except GatewayError as e:
            rec.outcome = rec.outcome or e.code or e.type
            if not rec.response_started:
                rec.status = e.status
                await send_error(send, e, self._headers(rec) + limit_headers)
        except Exception:
            log.exception("internal error on request %s", rec.request_id)
            rec.outcome = "internal_error"
            err = GatewayError("internal gateway error", code="internal_error")
            if not rec.response_started:
                rec.status = err.status
                await send_error(send, err, self._headers(rec))
            elif rec.stream:  # the stream started: end it with one in-band error event
                await end_stream_with_error(send, err)
        except asyncio.CancelledError:  # server shutdown past its grace period (uvicorn cancels)
            await self._cut_by_shutdown(send, rec)
        finally:
            # 5. account, then give back the rate-limit reservation with the actual usage
            try:
                await account(
                    state,
                    rec,
                    trace,
                    kind=self.kind,
                    doc=body.doc if body is not None else None,
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

    async def _cut_by_shutdown(self, send: Any, rec: RequestRecord) -> None:
        """Documented behaviour, not a failure: past ``server.graceful_shutdown_s`` uvicorn
        cancels the requests still open. Each is answered (503 ``shutdown`` before headers, one
        in-band error event on a started stream), logged on one WARNING line, and returns, so
        the server logs no traceback; the task's cancellation is consumed."""
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        rec.outcome = rec.outcome or "shutdown"
        err = GatewayError("gateway shutting down", status=503, code="shutdown", retry_after_s=1)
        if not rec.response_started:
            rec.status = err.status
            try:
                await send_error(send, err, self._headers(rec))
            except Exception:
                pass  # the client may be gone already
        elif rec.stream:
            await end_stream_with_error(send, err)
        log.warning("request %s cut short by shutdown (server.graceful_shutdown_s passed)",
                    rec.request_id)

    async def _respond(
        self,
        send: Any,
        plan: Plan,
        opened: OpenedResponse,
        body: ParsedBody,
        rec: RequestRecord,
        relayed: list[bytes],
        limit_headers: list[tuple[bytes, bytes]],
    ) -> None:
        pool = opened.attempt.pool
        rewriter = ChunkRewriter(
            pool.config.served_model_name,
            plan.request.model_name,
            "flex" if rec.flex and pool.tier == "standard" else TIER_TO_SERVICE_TIER[pool.tier],
        )
        headers = self._headers(rec) + limit_headers
        replica = opened.attempt.replica
        headers.append((b"x-speedgate-replica", replica.name.encode()))
        if not body.stream:
            assert opened.doc is not None
            rec.set_usage(opened.doc.get("usage"))
            headers += usage_headers(rec.usage, pool.config.prices, opened.ttft_s, rec.flex)
            payload = rewriter.body(opened.doc)
            rec.response_started, rec.status, rec.outcome = True, 200, "ok"
            await send_response(send, 200, payload, headers)
            return
        headers.append((b"x-speedgate-ttft-s", f"{opened.ttft_s:.4f}".encode()))
        assert opened.head is not None and opened.batches is not None
        rec.response_started, rec.status = True, 200
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS + headers})
        rec.itl = GapTimer()
        result = await relay_events(
            send,
            opened.head,
            opened.batches,
            rewriter,
            strip_usage=not body.client_wants_usage,
            stall_s=opened.attempt.stall_s,
            total_s=opened.attempt.total_s,
            deadline=opened.attempt.deadline,
            itl=rec.itl,
            relayed=relayed,
        )
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        rec.usage = result.usage
        if result.ok:
            rec.outcome = "ok"
            return
        assert result.error is not None
        rec.outcome = result.error.code
        if isinstance(result.error, UpstreamTimeout):
            self.state.metrics.record_timeout(pool, result.error.stage)
            if result.error.stage == "total":
                return  # the deadline expired: not the replica's fault
        if isinstance(result.error, UnreadableResponse):
            return  # deterministic (an oversized event): not the replica's health
        pool.record_failure(opened.attempt.replica, asyncio.get_running_loop().time())

    @staticmethod
    def _headers(rec: RequestRecord) -> list[tuple[bytes, bytes]]:
        out: list[tuple[bytes, bytes]] = [(b"x-request-id", rec.request_id.encode())]
        if rec.served_tier:
            out.append((b"x-speedgate-tier", rec.served_tier.encode()))
        if rec.fallback:
            out.append((b"x-speedgate-fallback", rec.fallback.encode()))
        if rec.auto_reason:
            out.append((b"x-speedgate-auto-reason", rec.auto_reason.encode()))
        if rec.queue_wait_s is not None:  # waited in the gateway queue of a saturated pool
            out.append((b"x-speedgate-queue-wait-s", f"{rec.queue_wait_s:.4f}".encode()))
        return out


def session_id_of(scope: Scope) -> str | None:
    """The request's ``x-session-id``, a long one as its fixed-size digest (``bounded_id``): what
    the routing tables, the ledger, the auto tier, usage totals and the logs keep."""
    raw = header(scope, b"x-session-id")
    return bounded_id(raw) if raw is not None else None


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


async def end_stream_with_error(send: Any, err: GatewayError) -> None:
    """Best effort: one in-band error event and the end of a started SSE stream (the client
    may be gone already)."""
    try:
        await send({"type": "http.response.body", "body": error_event(err), "more_body": False})
    except Exception:
        pass
