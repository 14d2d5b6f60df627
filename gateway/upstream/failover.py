"""Step 3 of a request, attempt: the plan's pools in order, retries on other replicas with
backoff and a retry budget, fallbacks, and feedback to outlier ejection.

Only before anything reached the client: ``open_with_failover`` returns the first attempt
that produced a first content event (stream) or a whole body (JSON), or raises the last
failure.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gateway.errors import (
    EngineClientError,
    GatewayError,
    NoHealthyReplica,
    UnreadableResponse,
    UpstreamTimeout,
)
from gateway.fleet.pools import Pool, Replica
from gateway.plan.chain import Plan
from gateway.routing import RouteRequest, pick_replica
from gateway.routing.keys import affinity_id
from gateway.telemetry.record import RequestRecord
from gateway.telemetry.tracing import AttemptTrace
from gateway.upstream.attempt import (
    STREAM_4XX,
    Attempt,
    OpenedResponse,
    RetryableFailure,
    open_attempt,
)
from gateway.upstream.deadline import ClientTimeouts, total_timeout_s
from gateway.upstream.deps import StepDeps
from gateway.upstream.exchange import Exchange
from gateway.upstream.retry import PoolHistory, RetryCause, Stop, StopReason, next_attempt

# plan reasons that dropped the asked-for tier before any attempt (the fallback header says so)
PLANNED_FALLBACKS = ("tier-unavailable", "context-does-not-fit")


async def open_with_failover(
    ex: Exchange,
    timeouts: ClientTimeouts | None = None,
    avoid: Sequence[Replica] = (),
    heartbeat: Callable[[], None] | None = None,
) -> OpenedResponse:
    """Try each pool of ``ex.plan.chain`` at most ``retry.max_attempts`` times, each attempt on
    a replica not tried yet, until one answers. ``ex.protocol`` makes each pool's upstream body
    and says when a stream's first content event arrived. ``timeouts`` (the client's, from its
    headers; default ``ex.timeouts``): ``total_s`` may shorten the first pool's ``total_s``,
    which bounds the whole request; ``read_s`` bounds the wait for the first byte since the
    request arrived (every attempt) and the stall between events after it. ``avoid``: replicas
    to ask only when no other is usable, in their pool or a later one of the chain (e.g. those
    whose streams of this request broke before a fresh attempt: the next tier before a
    replica that broke it).
    ``heartbeat``: each attempt's (``Attempt.heartbeat``: the engine's keep-alives).

    An in-stream error event with a client's 4xx code before any content (``stream-4xx``) is
    ambiguous: vLLM gives every exception in generation code 400 (``serving_chat``'s stream
    generator answers any exception with ``create_streaming_error_response``, default
    ``BAD_REQUEST``), so a broken replica sends it for every request. Differential diagnosis:
    it is asked once more on another replica of the pool, without spending the retry budget
    (at most one such retry per request, so at most twice the engine calls; spending the budget
    would let a replica that fails everything exhaust it and never be ejected). If that one
    answers, the first replica's failure is recorded (outlier ejection); if it sends an in-stream
    4xx too, that 4xx is the client's answer and no failure is recorded; with no other usable
    replica the 4xx is answered and nothing recorded (no telling whose fault it is).

    The body rule (a client's body never counts toward ejection): an engine's 500, or an
    in-stream error event before any content (``BODY_SUSPECT_REASONS``), may be the body's
    doing (an engine bug the body triggers) as much as the replica's. It is not recorded at
    once: the request is retried on another replica as usual (budget permitting); if that one
    fails the same way, the body is at fault: no more retries, the error is answered, and
    neither failure is recorded. If another replica serves it, or fails in another way, or
    nothing is left to ask, the first failure is recorded (as it would have been). So a body
    can fail at most two replicas and count against none, and a replica that fails what others
    serve is still ejected.

    Raises the last ``GatewayError`` (the engine's 4xx and ``UnreadableResponse`` at once,
    never retried, neither counted against the replica), an
    ``UpstreamTimeout`` when the deadline expires, or ``NoHealthyReplica`` (503) when no pool
    had a usable replica. Records ``rec.attempts``, ``rec.retries``, ``rec.fallback``,
    ``rec.served_tier``, ``rec.tried_tier`` and ``rec.replica`` (the replica's name, never its
    address: the last one tried, the one that served on success), ``rec.ttft_s`` and
    ``rec.queue_s``.
    """
    state, plan, body, protocol, rec = ex.state, ex.plan, ex.body, ex.protocol, ex.rec
    metrics = state.metrics
    payloads: dict[tuple[str, int | None], bytes] = {}
    loop = asyncio.get_running_loop()
    # the first tier dropped before any attempt: why, in the fallback header
    reasons = [RetryCause(None, plan.reason)] if plan.reason in PLANNED_FALLBACKS else []
    rec.auto_reason = plan.reason if plan.asked_tier == "auto" else None
    last: GatewayError | None = None
    deadline: float | None = None
    timeouts = timeouts or ex.timeouts
    read_deadline = None  # the client stops waiting for its first byte then (loop time)
    if timeouts.read_s is not None:
        read_deadline = loop.time() - (time.monotonic() - rec.t_start) + timeouts.read_s
    total_s = 0.0
    last_reason = ""
    previous_tier: str | None = None
    suspect: tuple[Pool, Replica] | None = None  # the replica of a stream-4xx (diagnosis)
    body_suspect: BodySuspect | None = None  # the first replica of a 5xx (the body rule)
    # session key + prefix blocks (gateway.routing.keys), shared by every pool of the chain
    route = plan.route
    if route is None:
        route = RouteRequest.from_doc(
            body.conversation, affinity_id(rec.session_id, rec.session_src, body.session_hint),
            scope=rec.key_id,
        )
    for position, pool in enumerate(plan.chain):
        if deadline is None:  # the first pool's total timeout bounds the whole request
            total_s = total_timeout_s(pool.config.timeouts.total_s, timeouts.total_s)
            deadline = loop.time() + total_s
        if previous_tier is not None:
            metrics.record_fallback(plan.request.model_name, previous_tier, pool.tier)
        previous_tier = pool.tier
        served = pool.config.served_model_name
        # vLLM's priority field only for engines that run priority scheduling (fcfs: 400)
        prio = plan.engine_priority if pool.config.scheduling_policy == "priority" else None
        if (served, prio) not in payloads:
            payloads[(served, prio)] = protocol.upstream_body(body, served, priority=prio)
        pool.budget.record_request(loop.time())
        avoided = [r for r in avoid if r in pool.replicas]
        tried: list[Replica] = []
        for _ in range(pool.config.retry.max_attempts):
            usable = pool.usable(loop.time())
            picked = await pick_replica(pool, route, usable, exclude=[*tried, *avoided])
            if (picked is None and avoided
                    and not _usable_later(plan.chain, position, avoid, loop.time())):
                # avoiding is a preference: a later pool's replica first, else better than none
                picked = await pick_replica(pool, route, usable, exclude=tried)
            history = PoolHistory(tuple(tried), last_reason or None,
                                  last.retry_after_s if last is not None else None)
            step = next_attempt(history, pool, picked, loop.time(), deadline)
            if isinstance(step, Stop):
                reasons.append(RetryCause(pool.tier, step.reason))
                break
            replica = step.replica
            if tried:  # a retry: the budget, the wait, then counted
                if step.spends_budget and not pool.budget.try_acquire(loop.time()):
                    reasons.append(RetryCause(pool.tier, StopReason.RETRY_BUDGET_EXHAUSTED))
                    break
                if step.wait_s:
                    if loop.time() + step.wait_s >= deadline:
                        break
                    await asyncio.sleep(step.wait_s)
                rec.retries.append(last_reason)
                metrics.record_retry(pool, last_reason)
            tried.append(replica)
            rec.attempts += 1
            rec.tried_tier, rec.replica = pool.tier, replica.name  # logged even if it never answers
            if rec.queue_s is None:
                rec.queue_s = time.monotonic() - rec.t_start
            span = ex.trace.attempt(
                pool=pool.key,
                tier=pool.tier,
                replica=replica.safe_url,
                model=served,
                number=rec.attempts,
                retry_reason=str(reasons[-1]) if reasons else None,
            )
            attempt = Attempt(
                pool=pool,
                replica=replica,
                payload=payloads[(served, prio)],
                protocol=protocol,
                request_id=rec.request_id,
                stream=body.upstream_stream,
                json_ok=body.assemble,
                kv_tokens=plan.route.tokens if plan.route is not None else 0,
                output_cap=plan.route.output_cap if plan.route is not None else 0,
                deadline=deadline,
                total_s=total_s,
                extra_headers=span.headers(),
                read_s=timeouts.read_s,
                read_deadline=read_deadline,
                heartbeat=heartbeat,
            )
            try:
                opened = await open_attempt(state.upstream, attempt)
            except RetryableFailure as f:
                if body_suspect is not None and body_suspect.same(f):
                    # two replicas failed this body alike: the body's fault, nobody's failure
                    span.end("body-fault", status=f.error.status)
                    metrics.record_attempt(pool, "body-fault")
                    _note_failure(rec, [*reasons, RetryCause(pool.tier, f.reason)], plan,
                                  previous_tier)
                    raise f.error from None
                if body_suspect is not None:  # failed otherwise: the first one counts
                    body_suspect.record(loop.time())
                    body_suspect = None
                if f.reason == STREAM_4XX and suspect is not None:
                    # two replicas refused it alike: the request's fault, nobody's failure
                    span.end("client-error", status=f.error.status)
                    metrics.record_attempt(pool, "client-error")
                    _note_failure(rec, reasons, plan, previous_tier)
                    raise f.error from None
                if f.reason == STREAM_4XX:
                    suspect = (pool, replica)
                reasons.append(RetryCause(pool.tier, f.reason))
                last, last_reason = f.error, f.reason
                if f.reason in BODY_SUSPECT_REASONS:  # counted once another replica answers
                    body_suspect = BodySuspect(pool, replica, f.reason)
                _note_retryable(state, pool, replica, span, f, loop.time(),
                                counts=body_suspect is None)
                continue
            except UpstreamTimeout as e:  # the total deadline: nothing more to try
                span.end("total-timeout")
                metrics.record_attempt(pool, "total-timeout")
                metrics.record_timeout(pool, e.stage)
                # not the replica's fault: the request's own deadline (a client's may be short)
                rec.fallback = ",".join(map(str, reasons)) or None
                raise
            except EngineClientError as e:
                span.end("client-error", status=e.status)
                metrics.record_attempt(pool, "client-error")
                raise
            except UnreadableResponse as e:  # deterministic: the same on any replica
                span.end("unreadable", status=e.status)
                metrics.record_attempt(pool, "unreadable")
                raise
            except BaseException:
                span.end("cancelled")
                raise
            if suspect is not None:  # another replica served what the suspect refused
                suspect[0].record_failure(suspect[1], loop.time())
            if body_suspect is not None:  # and what the body suspect failed
                body_suspect.record(loop.time())
            pool.record_success(replica)
            metrics.record_attempt(pool, "ok")
            opened.span = span
            rec.served_tier = pool.tier
            rec.ttft_s = opened.ttft_s
            if pool is not plan.chain[0] or plan.reason in PLANNED_FALLBACKS:
                rec.fallback = ",".join(map(str, reasons))
            return opened
        if loop.time() >= deadline or last_reason == STREAM_4XX:
            break  # a stream-4xx no other replica of the pool could check: answered as is
    if body_suspect is not None:  # nobody else was asked: counted as before the rule
        body_suspect.record(loop.time())
    _note_failure(rec, reasons, plan, previous_tier)
    if last is None:
        raise NoHealthyReplica(
            f"no healthy replica for model {plan.request.model_name!r}", retry_after_s=1
        )
    raise last


#: Failures that may be the body's doing (the body rule in ``open_with_failover``): the
#: engine's HTTP 500 and an in-stream error event before content whose code is not a 4xx.
BODY_SUSPECT_REASONS = frozenset({"http-500", "engine-error"})


@dataclass(slots=True)
class BodySuspect:
    """The first replica that failed a request in a way the body may have caused."""

    pool: Pool
    replica: Replica
    reason: str

    def same(self, f: RetryableFailure) -> bool:
        """True when ``f`` (from another replica) is the same kind of failure."""
        return f.reason == self.reason

    def record(self, now: float) -> None:
        """Count the failure against the replica after all (outlier ejection)."""
        self.pool.record_failure(self.replica, now)


def _note_retryable(
    state: StepDeps, pool: Pool, replica: Replica, span: AttemptTrace, f: RetryableFailure,
    now: float, counts: bool = True,
) -> None:
    """A retryable failure of ``replica`` at ``now`` (loop seconds): its span ended, the attempt
    and its timeout stage counted, and outlier detection fed when it was the replica's fault
    and ``counts`` (False while the body rule holds the count back)."""
    span.end(f.reason, status=f.error.status)
    state.metrics.record_attempt(pool, f.reason)
    if f.reason == "ttft-timeout":
        state.metrics.record_timeout(pool, "ttft")
    elif f.reason == "connect-timeout":
        state.metrics.record_timeout(pool, "connect")
    if counts and f.replica_fault:
        pool.record_failure(replica, now)


def _note_failure(
    rec: RequestRecord, reasons: list[RetryCause], plan: Plan, tier: str | None
) -> None:
    """``rec.fallback`` of a failed failover (``tier`` the last one asked): its ``reasons``,
    unless no tier changed and ``rec.fallback`` already says something (the resume notes of an
    earlier attempt of this request, which a fresh attempt keeps)."""
    moved = tier is not None and tier != plan.chain[0].tier
    if rec.fallback is None or moved or plan.reason == "tier-unavailable":
        rec.fallback = ",".join(map(str, reasons)) or None


def _usable_later(chain: list[Pool], position: int, avoid: Sequence[Replica], now: float) -> bool:
    """True when a pool after ``chain[position]`` has a usable replica not in ``avoid``."""
    return any(r not in avoid for p in chain[position + 1:] for r in p.usable(now))
