"""Open the continuation of a stream that broke after content reached the client (mid-stream
resume, docs/resilience.md): the same pool first, then the pools after it in the plan's
fallback chain; never a replica that already failed this request; within the request's
deadline, waiting for a slot when every usable replica is saturated; pools with
``resume.enabled: false`` skipped. Continuations are bounded by
``resume.max_resumes`` per request (``gateway.relay.resume``), not by the pools' retry budgets:
when a replica dies with many streams open, every one of them must be able to continue, and the
budget (meant to stop retry storms of fresh requests) would refuse most of them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from gateway.errors import EngineClientError, UnreadableResponse, UpstreamTimeout
from gateway.fleet.pools import Pool, Replica, wait_for_slot
from gateway.plan.chain import Plan
from gateway.protocols.base import Resumable, ResumePoint
from gateway.routing import RouteRequest, pick_replica
from gateway.routing.keys import affinity_id
from gateway.upstream.attempt import Attempt, OpenedResponse, RetryableFailure, open_attempt
from gateway.upstream.deps import StepDeps
from gateway.upstream.exchange import Exchange
from gateway.upstream.retry import full_jitter_backoff_s
from gateway.upstream.tokenize import TOKENIZE_TIMEOUT_S, engine_token_count

MIN_WAIT_S = 0.05  # shortest wait before looking again without a slot freed (seconds)
MAX_BACKOFF_INDEX = 16  # backoff exponent cap (the wait is ``backoff_max_s`` long before)


@dataclass(slots=True)
class Resumption:
    """What the continuations of one request share: the replicas that failed it (never asked
    again), and the deadline (loop time) and total timeout (seconds) of its first attempt."""

    plan: Plan
    deadline: float
    total_s: float
    read_s: float | None = None
    failed: list[Replica] = field(default_factory=list)
    stopped: str = ""  # why the last continuation could not open (logs, ``rec.resumes``)


async def open_continuation(
    ex: Exchange, res: Resumption, broken: Pool, point: ResumePoint
) -> OpenedResponse | None:
    """The first continuation attempt that produced a first content event, or None when none
    could; then ``res.stopped`` names what stopped it: ``deadline``, ``no-replica`` (every
    replica failed this request or was excluded, or none became usable in time),
    ``client-error`` (an engine refused the continuation with a 4xx) or ``total-timeout``.
    When no replica is usable at the moment (every slot taken at ``max_inflight_per_replica``,
    restarting, unhealthy, ejected) it waits for one: woken as soon as an attempt releases a
    slot in one of the pools (``wait_for_slot``), else after a full-jitter backoff (at least
    ``MIN_WAIT_S``), and looks again; for at most the broken pool's ``stall_s`` from the break
    (the longest gap the client's stream may have: a continuation that cannot start within it
    is a stall) and never past the request's deadline. Attempts are
    counted in ``rec.attempts`` and ``rec.retries`` (reason ``resume``) and the retry and
    attempt metrics, but take nothing from the pools' retry budgets; ``rec.served_tier`` and
    ``rec.replica`` follow the replica that took over. First, when ``point`` has no engine
    count of its carried text yet, one is asked of a usable replica (``_carried_tokens``,
    ``gateway.upstream.tokenize``: at most ``TOKENIZE_TIMEOUT_S``, within the wait above), which
    the output limit of the continuation is shrunk by."""
    state, body, protocol, rec = ex.state, ex.body, ex.protocol, ex.rec
    loop = asyncio.get_running_loop()
    chain = res.plan.chain
    start = chain.index(broken) if broken in chain else 0
    pools = [p for p in chain[start:] if p.config.resume.enabled]
    route = res.plan.route or RouteRequest.from_doc(
        body.conversation, affinity_id(rec.session_id, rec.session_src, body.session_hint),
            scope=rec.key_id,
    )
    # how long the continuation may wait for a usable replica: the request's deadline, and
    # the stall timeout the client is already subject to (no event may lag by more than
    # ``stall_s``; the broken pool's, counted from the break)
    wait_until = min(res.deadline, loop.time() + broken.config.timeouts.stall_s)
    if point.carried_tokens is None:
        point.carried_tokens = await _carried_tokens(state, res, pools, point, wait_until)
    assert isinstance(protocol, Resumable)  # a point without a blocker comes from one
    payloads = {
        id(p): protocol.continuation_body(
            body, p.config.served_model_name, point,
            priority=res.plan.engine_priority if p.config.scheduling_policy == "priority"
            else None)
        for p in pools
    }
    n = 0
    while True:
        n += 1
        for pool in pools:
            opened, stop = await _try_pool(ex, res, pool, payloads[id(pool)], route)
            if opened is not None or stop:
                return opened
        # no replica could take it now (the others saturated, restarting, unhealthy or
        # ejected): wait for a slot to free, looking again at least every backoff
        res.stopped = "no-replica"
        if not any(r not in res.failed for p in pools for r in p.replicas):
            return None
        now = loop.time()
        if now >= wait_until:
            res.stopped = "deadline" if wait_until >= res.deadline else "no-replica"
            return None
        pause = max(MIN_WAIT_S, full_jitter_backoff_s(min(n, MAX_BACKOFF_INDEX),
                                                      pools[0].config.retry))
        await wait_for_slot(pools, min(pause, wait_until - now))


async def _try_pool(
    ex: Exchange, res: Resumption, pool: Pool, payload: bytes, route: RouteRequest
) -> tuple[OpenedResponse | None, bool]:
    """``(opened, stop)``: the continuation opened on a usable replica of ``pool`` not in
    ``res.failed``, or None; ``stop`` when no further try may follow (the deadline). Sets
    ``res.stopped`` when it returns None."""
    state, protocol, rec = ex.state, ex.protocol, ex.rec
    loop = asyncio.get_running_loop()
    metrics = state.metrics
    served = pool.config.served_model_name
    for _ in range(pool.config.retry.max_attempts):
        if loop.time() >= res.deadline:
            res.stopped = "deadline"
            return None, True
        replica = await pick_replica(pool, route, pool.usable(loop.time()), exclude=res.failed)
        if replica is None:
            res.stopped = "no-replica"
            return None, False
        rec.attempts += 1
        rec.retries.append("resume")
        metrics.record_retry(pool, "resume")
        span = ex.trace.attempt(pool=pool.key, tier=pool.tier, replica=replica.safe_url,
                             model=served, number=rec.attempts, retry_reason="resume")
        attempt = Attempt(pool=pool, replica=replica, payload=payload, protocol=protocol,
                          request_id=rec.request_id, stream=True, deadline=res.deadline,
                          total_s=res.total_s, extra_headers=span.headers(), read_s=res.read_s,
                          path=protocol.continuation_path)
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
            res.stopped = "total-timeout"
            return None, True
        except (EngineClientError, UnreadableResponse) as e:
            # this pool's engine refuses the continuation: the next pool may take it
            span.end("client-error", status=e.status)
            metrics.record_attempt(pool, "client-error")
            res.failed.append(replica)
            res.stopped = "client-error"
            return None, False
        except BaseException:
            span.end("cancelled")
            raise
        pool.record_success(replica)
        metrics.record_attempt(pool, "ok")
        res.stopped = ""
        opened.span = span
        rec.served_tier, rec.replica = pool.tier, replica.name
        return opened, False
    res.stopped = "no-replica"
    return None, False


async def _carried_tokens(
    state: StepDeps, res: Resumption, pools: list[Pool], point: ResumePoint, until: float
) -> int | None:
    """The engine's count of the text the continuation carries (``engine_token_count``),
    asked of the first usable replica that has not failed this request, for at most
    ``TOKENIZE_TIMEOUT_S`` and never past ``until`` (loop time: the end of the continuation's
    wait); None when there is none or it cannot say."""
    texts = point.carried()
    if not any(texts):
        return 0
    loop = asyncio.get_running_loop()
    for pool in pools:
        for replica in pool.usable(loop.time()):
            if replica in res.failed:
                continue
            left = min(TOKENIZE_TIMEOUT_S, until - loop.time())
            return await engine_token_count(state.upstream, replica.url,
                                            pool.config.served_model_name, texts, left)
    return None
