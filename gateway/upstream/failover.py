"""Step 3 of a request, attempt: the plan's pools in order, retries on other replicas with
backoff and a retry budget, fallbacks, and feedback to outlier ejection. The loop keeps the
I/O and the recording; the decisions are pure: what a failure means
(``gateway.upstream.verdict``) and where the next attempt goes (``gateway.upstream.retry``).

Only before anything reached the client: ``open_with_failover`` returns the first attempt
that produced a first content event (stream) or a whole body (JSON), or raises the last
failure.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence

from gateway.common.usage import add_usage
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
from gateway.routing.fit import tokens_on
from gateway.routing.keys import affinity_id
from gateway.telemetry.cost import cost_usd
from gateway.telemetry.record import RequestRecord
from gateway.telemetry.tracing import AttemptTrace
from gateway.upstream import verdict
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
    replica that broke it). ``heartbeat``: each attempt's (``Attempt.heartbeat``: the engine's
    keep-alives). What a failure means (retry, answer, whose failure) is
    ``gateway.upstream.verdict``'s (the stream-4xx diagnosis, the body rule); where the next
    attempt goes is ``gateway.upstream.retry``'s.

    Raises the last ``GatewayError`` (the engine's 4xx and ``UnreadableResponse`` at once,
    never retried, neither counted against the replica), an
    ``UpstreamTimeout`` when the deadline expires, or ``NoHealthyReplica`` (503) when no pool
    had a usable replica. Records ``rec.attempts``, ``rec.retries``, ``rec.fallback``,
    ``rec.served_tier``, ``rec.tried_tier`` and ``rec.replica`` (the replica's name, never its
    address: the last one tried, the one that served on success), ``rec.ttft_s``,
    ``rec.queue_s`` and what failed attempts consumed (``rec.spent``).
    """
    run = _Failover(ex, timeouts or ex.timeouts, avoid, heartbeat)
    for position, pool in enumerate(ex.plan.chain):
        opened = await run.try_pool(position, pool)
        if opened is not None:
            return opened
        if run.loop.time() >= run.deadline or run.last_reason == STREAM_4XX:
            break  # a stream-4xx no other replica of the pool could check: answered as is
    _charge(verdict.after_all(run.held), run.loop.time())
    _note_failure(ex.rec, run.reasons, ex.plan, run.previous_tier)
    if run.last is None:
        raise NoHealthyReplica(
            f"no healthy replica for model {ex.plan.request.model_name!r}", retry_after_s=1
        )
    raise run.last


class _Failover:
    """One request's failover: the plan's pools in order, and what its attempts saw."""

    def __init__(self, ex: Exchange, timeouts: ClientTimeouts, avoid: Sequence[Replica],
                 heartbeat: Callable[[], None] | None) -> None:
        self.ex, self.avoid, self.heartbeat, self.timeouts = ex, avoid, heartbeat, timeouts
        plan, rec = ex.plan, ex.rec
        self.loop = asyncio.get_running_loop()
        self.payloads: dict[tuple[str, int | None], bytes] = {}
        # the first tier dropped before any attempt: why, in the fallback header
        self.reasons = ([RetryCause(None, plan.reason)] if plan.reason in PLANNED_FALLBACKS
                        else [])
        rec.auto_reason = plan.reason if plan.asked_tier == "auto" else None
        self.last: GatewayError | None = None
        self.last_reason = ""
        self.deadline = math.inf  # the first pool's total timeout bounds the whole request
        self.total_s = 0.0
        self.read_deadline: float | None = None  # the client stops waiting for a first byte
        if timeouts.read_s is not None:
            self.read_deadline = (self.loop.time() - (time.monotonic() - rec.t_start)
                                  + timeouts.read_s)
        self.previous_tier: str | None = None
        self.held = verdict.Diagnosis()
        # session key + prefix blocks (gateway.routing.keys), shared by every pool of the chain
        self.route = plan.route or RouteRequest.from_doc(
            ex.body.conversation,
            affinity_id(rec.session_id, rec.session_src, ex.body.session_hint),
            scope=rec.key_id,
        )

    def _enter(self, pool: Pool) -> bytes:
        """Start the attempts in ``pool``: the deadline (first pool), the fallback metric, the
        budget's request count; returns the pool's upstream body."""
        ex, now = self.ex, self.loop.time()
        if self.deadline == math.inf:
            self.total_s = total_timeout_s(pool.config.timeouts.total_s, self.timeouts.total_s)
            self.deadline = now + self.total_s
        if self.previous_tier is not None:
            ex.state.metrics.record_fallback(ex.plan.request.model_name, self.previous_tier,
                                             pool.tier)
        self.previous_tier = pool.tier
        served = pool.config.served_model_name
        # vLLM's priority field only for engines that run priority scheduling (fcfs: 400)
        prio = ex.plan.engine_priority if pool.config.scheduling_policy == "priority" else None
        if (served, prio) not in self.payloads:
            self.payloads[(served, prio)] = ex.protocol.upstream_body(ex.body, served,
                                                                      priority=prio)
        pool.budget.record_request(now)
        return self.payloads[(served, prio)]

    async def try_pool(self, position: int, pool: Pool) -> OpenedResponse | None:
        """The opened response of ``pool``'s first attempt that answers, None when none did."""
        payload = self._enter(pool)
        avoided = [r for r in self.avoid if r in pool.replicas]
        tried: list[Replica] = []
        for _ in range(pool.config.retry.max_attempts):
            replica = await self._next(position, pool, tried, avoided)
            if replica is None:
                return None
            tried.append(replica)
            opened = await self._attempt(pool, replica, payload)
            if opened is not None:
                return opened
        return None

    async def _next(self, position: int, pool: Pool, tried: list[Replica],
                    avoided: list[Replica]) -> Replica | None:
        """The replica to ask next in ``pool`` (``retry.next_attempt``), after the retry's
        budget and wait; None when the pool's attempts end."""
        loop, chain = self.loop, self.ex.plan.chain
        usable = pool.usable(loop.time())
        picked = await pick_replica(pool, self.route, usable, exclude=[*tried, *avoided])
        if (picked is None and avoided
                and not _usable_later(chain, position, self.avoid, loop.time())):
            # avoiding is a preference: a later pool's replica first, else better than none
            picked = await pick_replica(pool, self.route, usable, exclude=tried)
        history = PoolHistory(tuple(tried), self.last_reason or None,
                              self.last.retry_after_s if self.last is not None else None)
        step = next_attempt(history, pool, picked, loop.time(), self.deadline)
        if isinstance(step, Stop):
            self.reasons.append(RetryCause(pool.tier, step.reason))
            return None
        if tried:  # a retry: the budget, the wait, then counted
            if step.spends_budget and not pool.budget.try_acquire(loop.time()):
                self.reasons.append(RetryCause(pool.tier, StopReason.RETRY_BUDGET_EXHAUSTED))
                return None
            if step.wait_s:
                if loop.time() + step.wait_s >= self.deadline:
                    return None
                await asyncio.sleep(step.wait_s)
            self.ex.rec.retries.append(self.last_reason)
            self.ex.state.metrics.record_retry(pool, self.last_reason)
        return step.replica

    async def _attempt(self, pool: Pool, replica: Replica, payload: bytes
                       ) -> OpenedResponse | None:
        """One attempt on ``replica``: the opened response, or None after a retryable failure
        (recorded); raises what ends the request."""
        ex, rec, plan = self.ex, self.ex.rec, self.ex.plan
        metrics = ex.state.metrics
        rec.attempts += 1
        rec.tried_tier, rec.replica = pool.tier, replica.name  # logged even if it never answers
        if rec.queue_s is None:
            rec.queue_s = time.monotonic() - rec.t_start
        span = ex.trace.attempt(
            pool=pool.key, tier=pool.tier, replica=replica.safe_url,
            model=pool.config.served_model_name, number=rec.attempts,
            retry_reason=str(self.reasons[-1]) if self.reasons else None,
        )
        route = plan.route
        # a request sent without its output cap holds up to this replica's context
        kv_tokens = tokens_on(replica, route.tokens, route.fills_context) if route else 0
        attempt = Attempt(
            pool=pool, replica=replica, payload=payload, protocol=ex.protocol,
            request_id=rec.request_id, stream=ex.body.upstream_stream, json_ok=ex.body.assemble,
            kv_tokens=kv_tokens,
            output_cap=route.output_cap + kv_tokens - route.tokens if route is not None else 0,
            deadline=self.deadline, total_s=self.total_s, extra_headers=span.headers(),
            read_s=self.timeouts.read_s, read_deadline=self.read_deadline,
            heartbeat=self.heartbeat,
        )
        try:
            opened = await open_attempt(ex.state.upstream, attempt)
        except RetryableFailure as f:
            self._failed(pool, replica, span, f)
            return None
        except UpstreamTimeout as e:  # the total deadline: nothing more to try
            span.end("total-timeout")
            metrics.record_attempt(pool, "total-timeout")
            metrics.record_timeout(pool, e.stage)
            # not the replica's fault: the request's own deadline (a client's may be short)
            rec.fallback = ",".join(map(str, self.reasons)) or None
            raise
        except (EngineClientError, UnreadableResponse) as e:  # never retried
            kind = "client-error" if isinstance(e, EngineClientError) else "unreadable"
            span.end(kind, status=e.status)
            metrics.record_attempt(pool, kind)
            raise
        except BaseException:
            span.end("cancelled")
            raise
        _charge(verdict.after_success(self.held), self.loop.time())
        pool.record_success(replica)
        metrics.record_attempt(pool, "ok")
        opened.span = span
        rec.served_tier, rec.ttft_s = pool.tier, opened.ttft_s
        if pool is not plan.chain[0] or plan.reason in PLANNED_FALLBACKS:
            rec.fallback = ",".join(map(str, self.reasons))
        return opened

    def _failed(self, pool: Pool, replica: Replica, span: AttemptTrace,
                f: RetryableFailure) -> None:
        """Record a retryable failure by its verdict; raises its error when the verdict is to
        answer now."""
        ex, now = self.ex, self.loop.time()
        _note_spent(ex.rec, pool, f)
        v = verdict.after_failure(self.held, verdict.Failed(pool, replica, f.kind))
        self.held = v.diagnosis
        if v.answer is not None:
            _charge(v.charge, now)
            span.end(v.answer, status=f.error.status)
            ex.state.metrics.record_attempt(pool, v.answer)
            reasons = self.reasons
            if v.answer == "body-fault":
                reasons = [*reasons, RetryCause(pool.tier, f.reason)]
            _note_failure(ex.rec, reasons, ex.plan, self.previous_tier)
            raise f.error from None
        self.reasons.append(RetryCause(pool.tier, f.reason))
        self.last, self.last_reason = f.error, f.reason
        _note_retryable(ex.state, pool, replica, span, f, now, counts=False)
        _charge(v.charge, now)


def _charge(failures: Sequence[verdict.Failed], now: float) -> None:
    """Record each of ``failures`` against its replica (outlier ejection)."""
    for f in failures:
        f.pool.record_failure(f.replica, now)


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


def _note_spent(rec: RequestRecord, pool: Pool, f: RetryableFailure) -> None:
    """Add what a failed attempt's engine reported it consumed (``f.usage``) to ``rec.spent``
    and its cost at ``pool``'s prices to ``rec.spent_cost_usd``."""
    if f.usage is None:
        return
    rec.spent = f.usage if rec.spent is None else add_usage(rec.spent, f.usage)
    rec.spent_cost_usd += cost_usd(f.usage, pool.config.prices, rec.flex)


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
