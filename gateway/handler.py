"""The path of one request, top-down: admit → plan → attempt → relay → account (DESIGN §1).

``CompletionsEndpoint`` is a raw ASGI app mounted on ``/v1/chat/completions`` and
``/v1/completions``: no response models, no per-chunk validation. Each step calls a small
policy module: ``body`` (validate, rewrite owned fields), ``tiers`` and ``plan`` (tier and
fallback chain), ``routing`` (replica), ``attempt`` (one upstream try with staged timeouts),
``relay`` (SSE and JSON relay), ``access`` (the access log line).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Literal

from gateway.access import RequestRecord, log_request
from gateway.asgi import (
    ClientDisconnected,
    DisconnectWatch,
    Scope,
    header,
    read_body,
    send_error,
    send_response,
)
from gateway.attempt import Attempt, OpenedResponse, RetryableFailure, open_attempt
from gateway.body import ParsedBody, parse_body, upstream_body
from gateway.deadline import header_timeout_s, total_timeout_s
from gateway.errors import GatewayError, NoHealthyReplica, UpstreamTimeout
from gateway.plan import Plan, plan_request
from gateway.pools import Replica
from gateway.relay import SSE_HEADERS, ChunkRewriter, relay_events
from gateway.retry import full_jitter_backoff_s
from gateway.routing import pick_least_inflight
from gateway.state import GatewayState
from gateway.tiers import TIER_TO_SERVICE_TIER

log = logging.getLogger("speedgate.handler")


class CompletionsEndpoint:
    """ASGI app for ``POST /v1/chat/completions`` (``kind="chat"``) and ``/v1/completions``."""

    def __init__(self, state: GatewayState, kind: Literal["chat", "completion"]) -> None:
        self.state = state
        self.kind = kind
        self.path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        """Serve one request; every exit path answers the client (or records 499) and logs."""
        rec = RequestRecord(request_id=scope.get("speedgate.request_id", ""), path=self.path)
        try:
            # 1. admit
            cfg = self.state.config.server
            raw = await read_body(scope, receive, cfg.max_body_bytes)
            body = parse_body(raw, self.kind)
            # 2. plan
            treq = self.state.models.resolve(
                body.doc["model"], header(scope, b"x-speedgate-tier"), body.doc.get("service_tier")
            )
            plan = plan_request(treq, self.state.pools)
            timeout_s = header_timeout_s(
                header(scope, b"x-speedgate-timeout"), header(scope, b"x-stainless-timeout")
            )
            rec.model, rec.asked_tier, rec.stream = treq.model_name, treq.tier, body.stream
            async with DisconnectWatch(receive):
                # 3. attempt
                opened = await self._open(plan, body, rec, timeout_s)
                try:
                    # 4. relay
                    await self._respond(send, plan, opened, body, rec)
                finally:
                    opened.close()
        except ClientDisconnected:
            rec.status, rec.outcome = 499, "client_disconnected"
        except GatewayError as e:
            rec.outcome = rec.outcome or e.code or e.type
            if not rec.response_started:
                rec.status = e.status
                await send_error(send, e, self._headers(rec))
        except Exception:
            log.exception("internal error on request %s", rec.request_id)
            rec.outcome = "internal_error"
            if not rec.response_started:
                err = GatewayError("internal gateway error", code="internal_error")
                rec.status = err.status
                await send_error(send, err, self._headers(rec))
        finally:
            # 5. account
            rec.e2e_s = time.monotonic() - rec.t_start
            self.state.metrics.observe(rec)
            if self.state.config.server.access_log:
                log_request(rec)

    async def _open(
        self, plan: Plan, body: ParsedBody, rec: RequestRecord, timeout_s: float | None
    ) -> OpenedResponse:
        """Try the pools of the plan's chain in order, each at most ``retry.max_attempts``
        times on different replicas, until one answers (DESIGN §7: only before anything reached
        the client). Raises the last failure when none does."""
        add_usage = body.stream and not body.client_wants_usage
        payloads: dict[str, bytes] = {}
        loop = asyncio.get_running_loop()
        reasons: list[str] = [plan.reason] if plan.reason == "tier-unavailable" else []
        rec.auto_reason = plan.reason if plan.asked_tier == "auto" else None
        last: GatewayError | None = None
        deadline: float | None = None
        for pool in plan.chain:
            if deadline is None:  # the first pool's total timeout bounds the whole request
                deadline = loop.time() + total_timeout_s(pool.config.timeouts.total_s, timeout_s)
            served = pool.config.served_model_name
            if served not in payloads:
                payloads[served] = upstream_body(body, served, add_usage=add_usage)
            pool.budget.record_request(loop.time())
            tried: list[Replica] = []
            for n in range(pool.config.retry.max_attempts):
                replica = pick_least_inflight(pool.usable(loop.time()), exclude=tried)
                if replica is None:
                    reasons.append(f"{pool.tier}:no-usable-replica")
                    break
                if n > 0:
                    if not pool.budget.try_acquire(loop.time()):
                        reasons.append(f"{pool.tier}:retry-budget-exhausted")
                        break
                    assert last is not None
                    if last.retry_after_s is None:  # a 429's Retry-After is that replica's
                        pause = full_jitter_backoff_s(n, pool.config.retry)
                        if loop.time() + pause >= deadline:
                            break
                        await asyncio.sleep(pause)
                    rec.retries.append(reasons[-1])
                tried.append(replica)
                rec.attempts += 1
                attempt = Attempt(
                    pool=pool,
                    replica=replica,
                    payload=payloads[served],
                    path=self.path,
                    request_id=rec.request_id,
                    stream=body.stream,
                    deadline=deadline,
                )
                try:
                    opened = await open_attempt(self.state.upstream, attempt)
                except RetryableFailure as f:
                    reasons.append(f"{pool.tier}:{f.reason}")
                    last = f.error
                    if f.replica_fault:
                        pool.record_failure(replica, loop.time())
                    continue
                except UpstreamTimeout:  # the total deadline: nothing more to try
                    pool.record_failure(replica, loop.time())
                    rec.fallback = ",".join(reasons) or None
                    raise
                pool.record_success(replica)
                rec.served_tier, rec.replica = pool.tier, replica.safe_url
                rec.ttft_s = opened.ttft_s
                if pool is not plan.chain[0] or plan.reason == "tier-unavailable":
                    rec.fallback = ",".join(reasons)
                return opened
            if loop.time() >= deadline:
                break
        rec.fallback = ",".join(reasons) or None
        if last is None:
            raise NoHealthyReplica(
                f"no healthy replica for model {plan.request.model_name!r}", retry_after_s=1
            )
        raise last

    async def _respond(
        self,
        send: Any,
        plan: Plan,
        opened: OpenedResponse,
        body: ParsedBody,
        rec: RequestRecord,
    ) -> None:
        pool = opened.attempt.pool
        rewriter = ChunkRewriter(
            pool.config.served_model_name,
            plan.request.model_name,
            TIER_TO_SERVICE_TIER[pool.tier],
        )
        headers = self._headers(rec)
        rec.response_started, rec.status = True, 200
        if not body.stream:
            assert opened.doc is not None
            rec.set_usage(opened.doc.get("usage"))
            rec.outcome = "ok"
            await send_response(send, 200, rewriter.body(opened.doc), headers)
            return
        assert opened.head is not None and opened.batches is not None
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS + headers})
        result = await relay_events(
            send,
            opened.head,
            opened.batches,
            rewriter,
            strip_usage=not body.client_wants_usage,
            stall_s=pool.config.timeouts.stall_s,
            total_s=pool.config.timeouts.total_s,
            deadline=opened.attempt.deadline,
        )
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        rec.usage = result.usage
        if result.ok:
            rec.outcome = "ok"
        else:
            assert result.error is not None
            rec.outcome = result.error.code
            if isinstance(result.error, UpstreamTimeout) and result.error.stage == "total":
                return  # the deadline expired: not the replica's fault
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
        return out
