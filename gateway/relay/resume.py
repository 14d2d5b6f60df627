"""Relay with mid-stream resume: a stream that breaks after content reached the client continues
on another replica, spliced into the same client stream (docs/resilience.md, "Guarantees").

An unbroken stream costs what ``relay_events`` costs: nothing is parsed or accumulated on the
way; ``relayed`` (references to the raw payloads sent) is read only after a break, by the
protocol (``Resumable.resume_point``). What can be continued is decided then, by rule: the
break must be one of the replica's (a reset, EOF without the last event, a stall, a malformed
or error event; not the request's deadline, not an unreadable event, not an in-stream error
whose code is the client's 4xx, which is no replica's failure either), the pool must allow it
(``resume.enabled``, ``resume.max_resumes``) and the protocol must say how (no ``n > 1``, no
tool call under way, no finish relayed, no structured output). Otherwise the stream ends as
before, with one in-band error event of the protocol's kind (a JSON answer the gateway
assembles is asked again instead: ``gateway.relay.assembled``).

A break after every choice's finish reason was relayed (only the usage report and the end
marker lost) is neither: the engine ended the generation, so the gateway ends the stream as
the engine would have (``StreamCodec.ending``: OpenAI chat and completions send the usage
chunk, estimated, when the client asked for usage, then ``[DONE]``), outcome ``ok``; the
replica is still recorded as having broken it (outlier ejection), the break in ``rec.resumes``
with outcome ``completed``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from gateway.common.usage import Usage
from gateway.errors import UpstreamTimeout
from gateway.protocols.base import ResumePoint, StreamCodec, resume_point
from gateway.relay.stream import StreamLimits, StreamResult, relay_events
from gateway.telemetry.tokencount import count_text, estimate_usage
from gateway.upstream.attempt import OpenedResponse
from gateway.upstream.continuation import Resumption, open_continuation
from gateway.upstream.deps import StepDeps
from gateway.upstream.exchange import Exchange

log = logging.getLogger("speedgate.resume")

# breaks that say nothing about another replica's chances: not continued
NOT_RESUMABLE = frozenset({"total-timeout", "unreadable"})
# breaks that are no replica's failure (outlier ejection): those, and a continuation whose
# regenerated word differs from the one relayed (token healing, ``OpenAISplice``)
NOT_THE_REPLICAS = NOT_RESUMABLE | {"diverged"}


async def relay_resumable(
    ex: Exchange, send: Any, res: Resumption, codec: StreamCodec
) -> StreamResult:
    """Relay ``ex.attempts[-1]`` (the opened first attempt) through ``codec`` to ``send`` (the
    client's, or a sink for an assembled answer), and after each break the continuation that
    takes over (appended to ``ex.attempts``; the caller closes them all, each is closed here
    once it broke); the content payloads sent are collected in ``ex.relayed``. Returns the last
    attempt's result; on failure its in-band error event has been sent (when the last attempt
    diverged, the error of the replica's break before it: what the client is told broke its
    stream). Records each break in ``rec.resumes`` and ``speedgate_resumes_total``, and the
    broken replica's failure for outlier ejection; a continuation on another tier in
    ``rec.fallback`` (``<tier>:resume-<reason>``: the access log, and ``x-speedgate-fallback``
    of a JSON answer, whose headers are not sent yet) and ``speedgate_fallbacks_total``."""
    state, body, protocol, rec = ex.state, ex.body, ex.protocol, ex.rec
    attempts, relayed = ex.attempts, ex.relayed
    current = codec
    carried: list[int] = []  # output tokens (estimated) of each broken attempt
    before = 0
    no_heal = False
    cause: StreamResult | None = None  # the last break that was the replica's (not a divergence)
    while True:
        opened = attempts[-1]
        att = opened.attempt
        result = await relay_events(
            send, opened.head or [], opened.batches or _nothing(), current,
            StreamLimits(att.stall_s, att.total_s, att.deadline),
            itl=rec.itl, relayed=relayed, end_on_error=False,
        )
        if result.ok or result.error is None:
            return result
        if result.reason == "client-error":
            # the engine's in-stream 4xx after output: not resumed, ends in-band (an assembled
            # answer: that 4xx); the replica's failure, since a client's invalid request fails
            # before generation (vLLM gives any exception in generation code 400)
            if opened.span is not None:
                opened.span.end("client-error", status=result.error.status)
                opened.span = None
            att.pool.record_failure(att.replica, asyncio.get_running_loop().time())
            break
        diverged = getattr(current, "diverged", False)
        if diverged:  # the engine answered; the healed tail came back otherwise (sampling)
            result.reason = "diverged"
        else:
            cause = result
        _note_break(state, opened, result)
        reason = result.reason or "broken-stream"
        entry: dict[str, Any] = {"reason": reason, "from_tier": att.pool.tier}
        rec.resumes.append(entry)
        point = resume_point(protocol, body, relayed)
        if point.blocker is None:
            point.blocker = current.resume_blocker(point)
        if current.finished():  # a continuation's finish came: another would go past it
            point.complete = True
        if diverged or no_heal:  # carry the whole text from now on
            point.heal, no_heal = "", True
        if point.complete:  # every choice finished: only the usage and end marker lost
            ended = await _end_complete(ex, current)
            if ended is not None:
                events, usage = ended
                entry["outcome"] = "completed"
                state.metrics.record_resume(att.pool, reason, "completed")
                log.info("request %s: stream broke (%s) on %s after its finish: ended by "
                         "the gateway", rec.request_id, reason, att.replica.name)
                await send({"type": "http.response.body", "body": events, "more_body": True})
                return StreamResult(ok=True, usage=usage, events=result.events, reason=reason)
        rule = _refusal(att.pool.config.resume, reason, len(carried)) or point.blocker
        if rule is not None:
            entry.update(outcome="refused", rule=rule)
            state.metrics.record_resume(att.pool, reason, "refused")
            log.info("request %s: stream broke (%s) on %s, not resumed: %s",
                     rec.request_id, reason, att.replica.name, rule)
            break
        entry["carried_chars"] = len(point.text) + len(point.reasoning)
        res.failed.append(att.replica)
        nxt = await open_continuation(ex, res, att.pool, point)
        if nxt is None:
            entry.update(outcome="failed", rule=res.stopped or "no-replica")
            state.metrics.record_resume(att.pool, reason, "failed")
            log.warning("request %s: stream broke (%s) on %s and no replica could continue "
                        "it: %s (retries %s)", rec.request_id, reason, att.replica.name,
                        entry["rule"], ",".join(rec.retries) or "none")
            break
        opened.close()
        produced = _produced_tokens(point)
        carried.append(max(0, produced - before))
        before = produced
        entry.update(outcome="resumed", to_tier=nxt.attempt.pool.tier)
        if nxt.attempt.pool.tier != att.pool.tier:  # a fallback, as failover records one
            note = f"{att.pool.tier}:resume-{reason}"
            rec.fallback = f"{rec.fallback},{note}" if rec.fallback else note
            state.metrics.record_fallback(res.plan.request.model_name, att.pool.tier,
                                          nxt.attempt.pool.tier)
        state.metrics.record_resume(att.pool, reason, "resumed")
        attempts.append(nxt)
        current = codec.continuation(point, carried)
    if result.reason == "diverged" and cause is not None:
        # a divergence is the healing's, not a failure: the client is told what broke the stream
        result.error, result.error_event = cause.error, cause.error_event
    await send({"type": "http.response.body", "body": result.error_event, "more_body": True})
    return result


async def _end_complete(ex: Exchange, codec: StreamCodec) -> tuple[bytes, Usage | None] | None:
    """``(events, usage)`` that end a stream whose every choice finished before its replica
    broke it (``codec.ending``), or None when the protocol does not end streams so. Usage is
    the engine's when its report came; otherwise the gateway's estimate, as accounting makes
    one for an engine that never reports usage (tiktoken: the conversation's prompt and the
    relayed text, ``gateway.telemetry.tokencount``), and ``rec.usage_estimated`` is set (the
    access log and ``speedgate_usage_estimated_total`` say so)."""
    body, protocol, relayed = ex.body, ex.protocol, ex.relayed
    usage = codec.usage
    estimate = None
    if usage is None and protocol.generates:
        estimate = await estimate_usage(
            body.conversation, protocol.count_kind,  # type: ignore[arg-type]
            protocol.output_text(relayed), size_hint=len(body.raw),
            encoding=ex.state.config.telemetry.usage_estimate_encoding,
        )
    events = codec.ending(estimate, relayed)
    if events is None:
        return None
    if usage is None and estimate is not None:
        usage, ex.rec.usage_estimated = estimate, True
    return events, usage


def _produced_tokens(point: ResumePoint) -> int:
    """Output tokens the broken attempts produced up to ``point``: the engine's count of the
    carried text plus the healed tail's estimate when the continuation got that count
    (``gateway.upstream.tokenize``), else the estimate of the whole text."""
    if point.carried_tokens is None:
        return point.tokens
    return point.carried_tokens + count_text(point.heal)


def _refusal(cfg: Any, reason: str, resumes: int) -> str | None:
    """The rule that forbids continuing a break of ``reason`` after ``resumes`` continuations
    in a pool with resume config ``cfg``; None when the gateway may try."""
    if reason in NOT_RESUMABLE:
        return reason
    if not cfg.enabled:
        return "disabled"
    if resumes >= cfg.max_resumes:
        return "max-resumes"
    return None


def _note_break(state: StepDeps, opened: OpenedResponse, result: StreamResult) -> None:
    """The broken attempt's span and metrics, and its replica's failure (outlier ejection)
    unless the break is not the replica's doing (the request's deadline, an unreadable
    event)."""
    pool, replica = opened.attempt.pool, opened.attempt.replica
    if opened.span is not None:
        opened.span.end(result.reason or "broken-stream")
        opened.span = None
    if isinstance(result.error, UpstreamTimeout):
        state.metrics.record_timeout(pool, result.error.stage)
    if result.reason in NOT_THE_REPLICAS:
        return
    pool.record_failure(replica, asyncio.get_running_loop().time())


async def _nothing() -> Any:
    return
    yield  # an empty async iterator
