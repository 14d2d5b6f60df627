"""A non-stream (JSON) answer assembled from the engine's stream: relayed through the protocol's
assembler with mid-stream resume, and, since nothing reached the client yet, never lost to a
break that cannot be resumed (docs/resilience.md, "Guarantees").

After a break the gateway continues the stream when the rules allow (``relay_resumable``). When
they do not (``n > 1``, a tool call under way, ``echo``, ``max_resumes`` spent, a structured
output, ...), the answer is either complete already (a finish reason received for every choice:
served, its usage estimated when the engine's usage chunk never came) or asked again from
scratch: a fresh attempt with failover, as for a failure before the first byte, within the
request's deadline and its first pool's retry budget, avoiding the replicas that broke it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import orjson

from gateway.common.usage import Usage
from gateway.errors import GatewayError
from gateway.protocols.base import Assembling, Protocol, Rewrite, assembler
from gateway.protocols.body import ParsedBody
from gateway.relay.resume import relay_resumable
from gateway.telemetry.record import RequestRecord
from gateway.telemetry.tokencount import estimate_usage
from gateway.upstream.client import forget_traceback
from gateway.upstream.continuation import Resumption
from gateway.upstream.deadline import ClientTimeouts
from gateway.upstream.exchange import Exchange
from gateway.upstream.failover import open_with_failover

log = logging.getLogger("speedgate.resume")

MAX_FRESH = 2  # fresh attempts after unresumable breaks, per request
# refusals a fresh attempt cannot help: the request's deadline, an event no replica could send
# readably (the same on every replica), the client's own error
NOT_RETRIED = frozenset({"total-timeout", "unreadable"})


async def assemble_json(ex: Exchange, rewrite: Rewrite) -> tuple[dict[str, Any], float]:
    """The JSON answer (the engine's document shape) from ``ex.attempts[-1]``'s stream, and the
    upstream seconds it took; ``rewrite`` for the protocol's assembler. A fresh attempt that
    opens is appended to ``ex.attempts`` (the caller closes them all and reads the last one's
    pool and replica); ``ex.relayed`` then holds only its payloads. An engine that answered the
    fresh attempt with a JSON body is served as is. Raises the last failure's ``GatewayError``
    (e.g. 502, 504) when no answer came."""
    out = await _assemble(ex, rewrite)
    if isinstance(out, GatewayError):
        # raised from here, with no local left holding it: a frame of its own traceback that
        # held the error would make a reference cycle per failed request
        try:
            raise out
        finally:
            del out
    return out


async def _assemble(ex: Exchange, rewrite: Rewrite) -> tuple[dict[str, Any], float] | GatewayError:
    """``assemble_json``'s answer, or the error to raise."""
    state, plan, body, protocol, rec = ex.state, ex.plan, ex.body, ex.protocol, ex.rec
    attempts, relayed = ex.attempts, ex.relayed
    fresh = 0
    while True:
        opened = attempts[-1]
        if opened.doc is not None:  # the engine answered JSON itself
            return opened.doc, opened.ttft_s
        codec = assembler(protocol, body, rewrite)
        assert codec is not None and isinstance(protocol, Assembling)
        att = opened.attempt
        t0 = time.monotonic() - opened.ttft_s
        res = Resumption(plan, att.deadline, att.total_s, att.read_s)
        result = await relay_resumable(ex, _discard, res, codec)
        if result.ok:
            return protocol.assemble(relayed, result.usage), time.monotonic() - t0
        err = result.error
        assert err is not None
        last = rec.resumes[-1] if rec.resumes else {}
        if result.reason == "client-error" or last.get("outcome") != "refused":
            return err  # the client's 4xx, or no replica could continue it (nor would start it)
        if _finished(body, relayed):
            return await _complete(body, protocol, rec, relayed), time.monotonic() - t0
        pool = attempts[-1].attempt.pool
        loop = asyncio.get_running_loop()
        if last.get("rule") in NOT_RETRIED or fresh >= MAX_FRESH or loop.time() >= att.deadline:
            return err
        if not pool.budget.try_acquire(loop.time()):
            log.info("request %s: JSON answer broke (%s), not resumable (%s): no fresh attempt, "
                     "the retry budget of %s is spent", rec.request_id, result.reason,
                     last.get("rule"), pool.key)
            return err
        fresh += 1
        reason = f"fresh-after-{last.get('rule')}"
        rec.retries.append(reason)
        state.metrics.record_retry(pool, reason)
        log.info("request %s: JSON answer broke (%s), not resumable (%s): asking again",
                 rec.request_id, result.reason, last.get("rule"))
        attempts[-1].close()  # its replica's slot back while the fresh attempt runs
        relayed.clear()
        timeouts = ClientTimeouts(total_s=max(0.001, att.deadline - loop.time()), read_s=att.read_s)
        try:
            nxt = await open_with_failover(ex, timeouts,
                                           avoid=[a.attempt.replica for a in attempts])
        except GatewayError as e:
            forget_traceback(e)  # converted: the first failure is the one the client gets
            return err
        attempts.append(nxt)


def _finished(body: ParsedBody, relayed: list[bytes]) -> bool:
    """True when ``relayed`` holds a finish reason for every one of the request's choices
    (``n``, default 1): the answer is complete, only the usage chunk or ``[DONE]`` missing."""
    want = body.doc.get("n") or 1
    done: set[int] = set()
    for data in relayed:
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        for c in (chunk.get("choices") or ()) if isinstance(chunk, dict) else ():
            if isinstance(c, dict) and c.get("finish_reason") is not None:
                done.add(c.get("index", 0))
    return isinstance(want, int) and len(done) >= want


async def _complete(
    body: ParsedBody, protocol: Protocol, rec: RequestRecord, relayed: list[bytes]
) -> dict[str, Any]:
    """The complete answer of ``relayed``; its usage the engine's when its chunk came, else
    estimated (``rec.usage_estimated``) from the conversation and the text (tiktoken)."""
    assert isinstance(protocol, Assembling)  # only an API that assembles relays for it
    doc = protocol.assemble(relayed, None)
    if doc.get("usage") is None:
        usage: Usage = await estimate_usage(
            body.conversation, protocol.count_kind,  # type: ignore[arg-type]
            protocol.output_text(relayed), size_hint=0)
        doc = protocol.assemble(relayed, usage)
        rec.usage_estimated = True
    return doc


async def _discard(message: Any) -> None:
    """An ASGI ``send`` that drops what it is given (an assembled answer's stream events)."""
