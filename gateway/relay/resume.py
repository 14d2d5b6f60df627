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
from dataclasses import dataclass
from typing import Any

from gateway.common.usage import Usage
from gateway.errors import UpstreamTimeout
from gateway.protocols.base import ResumePoint, StreamCodec, resume_point
from gateway.relay.stream import StreamLimits, StreamResult, relay_events
from gateway.telemetry.record import RequestRecord
from gateway.telemetry.tokencount import count_text, estimate_usage
from gateway.upstream.attempt import OpenedResponse
from gateway.upstream.continuation import Resumption, open_continuation
from gateway.upstream.deps import StepDeps
from gateway.upstream.exchange import Exchange
from gateway.upstream.failures import Failure, traits

log = logging.getLogger("speedgate.resume")



@dataclass(slots=True)
class ResumeEntry:
    """One break of a stream after content reached the client, as ``rec.resumes`` keeps it
    (``record``, appended at the break): ``reason`` (a ``Failure``), ``from_tier``, then
    ``carried_chars`` (the text carried into a continuation), ``outcome`` (``resumed``,
    ``completed``, ``refused``, ``failed``), ``rule`` (why not resumed) and ``to_tier``."""

    record: dict[str, Any]

    @classmethod
    def start(cls, rec: RequestRecord, reason: str, from_tier: str) -> ResumeEntry:
        """The entry of a break of ``reason`` on ``from_tier``, appended to ``rec.resumes``."""
        entry = cls({"reason": reason, "from_tier": from_tier})
        rec.resumes.append(entry.record)
        return entry

    def carried(self, chars: int) -> None:
        """The continuation carries ``chars`` characters of text."""
        self.record["carried_chars"] = chars

    def settle(self, outcome: str, rule: str | None = None, to_tier: str | None = None) -> None:
        """How the break ended: ``outcome``, with the ``rule`` that refused or stopped it, or
        the tier that took over."""
        self.record["outcome"] = outcome
        if rule is not None:
            self.record["rule"] = rule
        if to_tier is not None:
            self.record["to_tier"] = to_tier


async def relay_resumable(
    ex: Exchange, send: Any, res: Resumption, codec: StreamCodec
) -> StreamResult:
    """Relay ``ex.attempts[-1]`` (the opened first attempt) through ``codec`` to ``send`` (the
    client's, or a sink for an assembled answer), and after each break the continuation that
    takes over (appended to ``ex.attempts``; the caller closes them all, each is closed here
    once it broke); the content payloads sent are collected in ``ex.relayed``. Returns the last
    attempt's result; on failure its in-band error event has been sent (when the last attempt
    diverged, the error of the replica's break before it: what the client is told broke its
    stream). Records each break in ``rec.resumes`` (``ResumeEntry``) and
    ``speedgate_resumes_total``, and the broken replica's failure for outlier ejection (a
    divergence is none: its replica is neither counted nor excluded from the continuations);
    a continuation on another tier in ``rec.fallback`` (``<tier>:resume-<reason>``: the access
    log, and ``x-speedgate-fallback`` of a JSON answer, whose headers are not sent yet) and
    ``speedgate_fallbacks_total``."""
    run = _Resumer(ex, res, codec)
    while True:
        opened = ex.attempts[-1]
        att = opened.attempt
        result = await relay_events(
            send, opened.head or [], opened.batches or _nothing(), run.current,
            StreamLimits(att.stall_s, att.total_s, att.deadline),
            itl=ex.rec.itl, relayed=ex.relayed, end_on_error=False,
        )
        if result.ok or result.error is None:
            return result
        step = await run.after_break(opened, result, send)
        if isinstance(step, StreamResult):  # ended by the gateway after its finish
            return step
        if not step:
            break
    if result.reason == Failure.DIVERGED and run.cause is not None:
        # a divergence is the healing's, not a failure: the client is told what broke the stream
        result.error, result.error_event = run.cause.error, run.cause.error_event
    await send({"type": "http.response.body", "body": result.error_event, "more_body": True})
    return result


class _Resumer:
    """What the breaks of one stream share: the codec relaying now (``current``), the output
    tokens each broken attempt carried, whether healing is off (after a divergence), and the
    last break that was the replica's (``cause``)."""

    def __init__(self, ex: Exchange, res: Resumption, codec: StreamCodec) -> None:
        self.ex, self.res, self.codec, self.current = ex, res, codec, codec
        self.carried: list[int] = []  # output tokens (estimated) of each broken attempt
        self.before = 0
        self.no_heal = False
        self.cause: StreamResult | None = None

    async def after_break(self, opened: OpenedResponse, result: StreamResult,
                          send: Any) -> StreamResult | bool:
        """Take one break: True when a continuation took over (``ex.attempts``), False when
        the stream ends with its error, or the ``StreamResult`` of a stream the gateway ended
        after its finish (its ending sent)."""
        ex, att = self.ex, opened.attempt
        state, rec = ex.state, ex.rec
        if result.reason == Failure.CLIENT_ERROR:
            # the engine's in-stream 4xx after output: not resumed, ends in-band (an assembled
            # answer: that 4xx); the replica's failure, since a client's invalid request fails
            # before generation (vLLM gives any exception in generation code 400)
            if opened.span is not None:
                opened.span.end("client-error", status=result.error.status if result.error
                                else None)
                opened.span = None
            att.pool.record_failure(att.replica, asyncio.get_running_loop().time())
            return False
        diverged = getattr(self.current, "diverged", False)
        if diverged:  # the engine answered; the healed tail came back otherwise (sampling)
            result.reason = Failure.DIVERGED
        else:
            self.cause = result
        _note_break(state, opened, result)
        reason = result.reason or Failure.BROKEN_STREAM
        entry = ResumeEntry.start(rec, reason, att.pool.tier)
        point = self._point(diverged)
        if point.complete:  # every choice finished: only the usage and end marker lost
            ended = await _end_complete(ex, self.current)
            if ended is not None:
                events, usage = ended
                entry.settle("completed")
                state.metrics.record_resume(att.pool, reason, "completed")
                log.info("request %s: stream broke (%s) on %s after its finish: ended by "
                         "the gateway", rec.request_id, reason, att.replica.name)
                await send({"type": "http.response.body", "body": events, "more_body": True})
                return StreamResult(ok=True, usage=usage, events=result.events, reason=reason)
        rule = _refusal(att.pool.config.resume, reason, len(self.carried)) or point.blocker
        if rule is not None:
            entry.settle("refused", rule)
            state.metrics.record_resume(att.pool, reason, "refused")
            log.info("request %s: stream broke (%s) on %s, not resumed: %s",
                     rec.request_id, reason, att.replica.name, rule)
            return False
        return await self._continue(opened, point, entry, reason, diverged)

    def _point(self, diverged: bool) -> ResumePoint:
        """What the client got (``resume_point``: the protocol's, when it can resume) with
        the codec's blocker, whether every choice finished, and the healing (off from a
        divergence on)."""
        ex, current = self.ex, self.current
        point = resume_point(ex.protocol, ex.body, ex.relayed)
        if point.blocker is None:
            point.blocker = current.resume_blocker(point)
        if current.finished():  # a continuation's finish came: another would go past it
            point.complete = True
        if diverged or self.no_heal:  # carry the whole text from now on
            point.heal, self.no_heal = "", True
        return point

    async def _continue(self, opened: OpenedResponse, point: ResumePoint, entry: ResumeEntry,
                        reason: str, diverged: bool) -> bool:
        """Open the continuation of ``point``; True when one took over."""
        ex, res, att = self.ex, self.res, opened.attempt
        state, rec = ex.state, ex.rec
        entry.carried(len(point.text) + len(point.reasoning))
        if not diverged:  # a divergence is the healing's: its replica may continue again
            res.failed.append(att.replica)
        nxt = await open_continuation(ex, res, att.pool, point)
        if nxt is None:
            entry.settle("failed", res.stopped or "no-replica")
            state.metrics.record_resume(att.pool, reason, "failed")
            log.warning("request %s: stream broke (%s) on %s and no replica could continue "
                        "it: %s (retries %s)", rec.request_id, reason, att.replica.name,
                        res.stopped or "no-replica", ",".join(rec.retries) or "none")
            return False
        opened.close()
        produced = _produced_tokens(point)
        self.carried.append(max(0, produced - self.before))
        self.before = produced
        to_tier = nxt.attempt.pool.tier
        entry.settle("resumed", to_tier=to_tier)
        if to_tier != att.pool.tier:  # a fallback, as failover records one
            note = f"{att.pool.tier}:resume-{reason}"
            rec.fallback = f"{rec.fallback},{note}" if rec.fallback else note
            state.metrics.record_fallback(res.plan.request.model_name, att.pool.tier, to_tier)
        state.metrics.record_resume(att.pool, reason, "resumed")
        ex.attempts.append(nxt)
        self.current = self.codec.continuation(point, self.carried)
        return True


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
    if not traits(reason).resumable:  # says nothing about another replica's chances
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
    if not traits(result.reason or Failure.BROKEN_STREAM).replica_fault:
        return  # the request's deadline, an unreadable event, a divergence
    pool.record_failure(replica, asyncio.get_running_loop().time())


async def _nothing() -> Any:
    return
    yield  # an empty async iterator
