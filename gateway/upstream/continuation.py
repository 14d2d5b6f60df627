"""Open the continuation of a stream that broke after content reached the client (mid-stream
resume, README "Guarantees"): the same pool first, then the pools after it in the plan's
fallback chain; never a replica that already failed this request; within the request's
deadline and each pool's retry budget; pools with ``resume.enabled: false`` skipped.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from gateway.errors import EngineClientError, UnreadableResponse, UpstreamTimeout
from gateway.plan.chain import Plan
from gateway.protocols.base import Protocol, ResumePoint
from gateway.relay.body import ParsedBody
from gateway.routing import RouteRequest, pick_replica
from gateway.routing.pools import Pool, Replica
from gateway.state import GatewayState
from gateway.telemetry.record import RequestRecord
from gateway.telemetry.tracing import RequestTrace
from gateway.upstream.attempt import Attempt, OpenedResponse, RetryableFailure, open_attempt


@dataclass(slots=True)
class Resumption:
    """What the continuations of one request share: the replicas that failed it (never asked
    again), and the deadline (loop time) and total timeout (seconds) of its first attempt."""

    plan: Plan
    deadline: float
    total_s: float
    read_s: float | None = None
    failed: list[Replica] = field(default_factory=list)


async def open_continuation(
    state: GatewayState,
    res: Resumption,
    broken: Pool,
    body: ParsedBody,
    protocol: Protocol,
    point: ResumePoint,
    rec: RequestRecord,
    trace: RequestTrace,
) -> OpenedResponse | None:
    """The first continuation attempt that produced a first content event, or None when none
    could (every usable replica failed or was excluded, the retry budgets are spent, the
    deadline passed, or an engine refused the continuation with a 4xx). Each attempt is one
    retry of its pool's budget, counted in ``rec.attempts`` and ``rec.retries`` (reason
    ``resume``) and the attempt metrics; ``rec.served_tier`` and ``rec.replica`` follow the
    replica that took over."""
    loop = asyncio.get_running_loop()
    metrics = state.metrics
    chain = res.plan.chain
    start = chain.index(broken) if broken in chain else 0
    route = res.plan.route or RouteRequest.from_doc(
        body.conversation, rec.session_id or body.session_hint, scope=rec.key_id
    )
    for pool in chain[start:]:
        if not pool.config.resume.enabled:
            continue
        served = pool.config.served_model_name
        prio = res.plan.engine_priority if pool.config.scheduling_policy == "priority" else None
        payload = protocol.continuation_body(body, served, point, priority=prio)
        for _ in range(pool.config.retry.max_attempts):
            if loop.time() >= res.deadline:
                return None
            replica = await pick_replica(pool, route, pool.usable(loop.time()),
                                         exclude=res.failed)
            if replica is None or not pool.budget.try_acquire(loop.time()):
                break
            rec.attempts += 1
            rec.retries.append("resume")
            metrics.record_retry(pool, "resume")
            span = trace.attempt(pool=pool.key, tier=pool.tier, replica=replica.safe_url,
                                 model=served, number=rec.attempts, retry_reason="resume")
            attempt = Attempt(pool=pool, replica=replica, payload=payload, protocol=protocol,
                              request_id=rec.request_id, stream=True, deadline=res.deadline,
                              total_s=res.total_s, extra_headers=span.headers(),
                              read_s=res.read_s)
            try:
                opened = await open_attempt(state.upstream, attempt)
            except RetryableFailure as f:
                res.failed.append(replica)
                span.end(f.reason, status=f.error.status)
                metrics.record_attempt(pool, f.reason)
                if f.replica_fault:
                    pool.record_failure(replica, loop.time())
                continue
            except UpstreamTimeout:
                span.end("total-timeout")
                metrics.record_attempt(pool, "total-timeout")
                return None
            except (EngineClientError, UnreadableResponse) as e:
                # this pool's engine refuses the continuation: the next pool may take it
                span.end("client-error", status=e.status)
                metrics.record_attempt(pool, "client-error")
                res.failed.append(replica)
                break
            except BaseException:
                span.end("cancelled")
                raise
            pool.record_success(replica)
            metrics.record_attempt(pool, "ok")
            opened.span = span
            rec.served_tier, rec.replica = pool.tier, replica.name
            return opened
    return None
