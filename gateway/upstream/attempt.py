"""One upstream attempt with staged timeouts, up to the point where the client can be answered.

For a stream that point is the first content event (headers and the role chunk are not a first
token); for a non-stream request it is the whole JSON body. Until then a failure is
``RetryableFailure`` (the caller may try another replica or pool) unless it is the client's
fault (engine 4xx other than 408/429: raised as is) or the request's total deadline expired
(``UpstreamTimeout("total")``). The replica's in-flight count is held from the start of the
attempt until ``OpenedResponse.close()``.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC
from email.utils import parsedate_to_datetime

import orjson

from gateway.common.sse import SSEEvent
from gateway.common.usage import Usage
from gateway.errors import (
    GatewayError,
    UnreadableResponse,
    UpstreamError,
    UpstreamOverloaded,
    UpstreamTimeout,
    is_client_fault,
    parse_engine_error,
)
from gateway.fleet.pools import Pool, Replica
from gateway.protocols.base import HEAD_CONTENT, HEAD_ERROR, HEAD_FRAME, HEAD_MALFORMED, Protocol
from gateway.telemetry.tracing import AttemptTrace
from gateway.upstream.client import (
    MAX_ERROR_BODY_BYTES,
    UpstreamBrokenError,
    UpstreamConnectError,
    UpstreamUnreadable,
)
from gateway.upstream.failures import TRAITS, Failure, failure_kind, http_reason
from gateway.upstream.transport import UpstreamClient, UpstreamReply

RETRYABLE_STATUSES = frozenset({408, 429})
#: reason of an in-stream error event with a client's 4xx code before any content: the
#: request's fault or the replica's, which only another replica's answer tells (failover)
STREAM_4XX = Failure.STREAM_4XX
#: reason of an engine that said it is overloaded (HTTP 529, an ``overloaded_error`` before any
#: content): busy like a 429, not broken; retried elsewhere, not an outlier failure
OVERLOADED = Failure.OVERLOADED


class RetryableFailure(Exception):
    """The attempt failed before anything reached the client; ``reason`` is a short slug
    (``connect-error``, ``http-503``, ``ttft-timeout``, ``broken-stream``, ``malformed``,
    ``stream-4xx``) and
    ``error`` what the client gets if no other attempt succeeds."""

    def __init__(self, reason: str, error: GatewayError, usage: Usage | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.error = error
        self.usage = usage  # what the engine reported it consumed (e.g. ``response.failed``)

    @property
    def kind(self) -> Failure:
        """The kind of this failure (``gateway.upstream.failures``)."""
        return failure_kind(self.reason)

    @property
    def replica_fault(self) -> bool:
        """True when the failure says the replica is unhealthy (for outlier ejection):
        ``TRAITS`` of its kind (a 429, 408 or overload says busy, not broken; a ``stream-4xx``
        is the replica's only once another replica answered the request)."""
        return TRAITS[self.kind].replica_fault


@dataclass(slots=True)
class Attempt:
    """What to send where: ``payload`` to ``replica`` of ``pool`` at ``protocol.path``;
    ``deadline`` is the loop time of the request's total deadline."""

    pool: Pool
    replica: Replica
    payload: bytes
    protocol: Protocol
    request_id: str
    stream: bool
    deadline: float
    total_s: float = 0.0  # the request's total timeout in seconds (for messages)
    extra_headers: dict[str, str] | None = None  # e.g. W3C traceparent of the attempt span
    read_s: float | None = None  # the client's read timeout (x-stainless-read-timeout), s
    read_deadline: float | None = None  # loop time the client stops waiting for a first byte
    json_ok: bool = False  # a JSON answer to be assembled: an engine's JSON body serves too
    #: called for each keep-alive of the engine (an SSE comment, Messages' ``ping``) before the
    #: first content event: a committed stream relays it (``gateway.relay.keepalive``)
    heartbeat: Callable[[], None] | None = None
    kv_tokens: int = 0  # the request's prompt + output cap (routing.fit), 0 = not counted
    output_cap: int = 0  # of which output tokens (the wait estimate, routing.kv_placement)
    path: str | None = None  # the engine's path when not the protocol's (a continuation's)

    @property
    def stall_s(self) -> float:
        """Longest gap between events once the stream flows: the pool's ``stall_s``, shorter
        when the client's own read timeout is."""
        stall = self.pool.config.timeouts.stall_s
        return stall if self.read_s is None else min(stall, self.read_s)


@dataclass(slots=True, eq=False)
class OpenedResponse:
    """A successful attempt: for streams the events up to the first content event (``head``:
    e.g. the role chunk, then the content event) and the ``events`` iterator that continues
    after it; for JSON the parsed ``doc``. ``ttft_s``: seconds from send to the first content
    event (streams) or to the complete body. ``batches`` continues after ``head``."""

    attempt: Attempt
    response: UpstreamReply
    ttft_s: float
    head: list[SSEEvent] | None = None
    batches: AsyncIterator[list[SSEEvent]] | None = None
    doc: dict | None = None
    span: AttemptTrace | None = None
    _closed: bool = False

    def close(self) -> None:
        """Release the upstream connection (aborting the engine if unfinished) and the
        replica's in-flight slot. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.response.close()
        self.attempt.pool.release(self.attempt.replica, self.attempt.kv_tokens,
                                     id(self.attempt))


async def open_attempt(upstream: UpstreamClient, attempt: Attempt) -> OpenedResponse:
    """Send the attempt and wait for its first content event (stream) or its body (JSON).

    Timeouts (``pool.config.timeouts``): ``connect_s`` for the TCP connect; ``ttft_s`` from
    send to the first content event (streams only: a non-stream response has no first token;
    a role chunk or a comment is not content); the total deadline for everything; the client's
    ``read_deadline`` for the first byte it gets (the content event, or the JSON body). Raises
    ``RetryableFailure``, ``UpstreamTimeout`` (total deadline, or ``read``: the client's read
    timeout), the engine's 4xx as
    ``EngineClientError``, or ``UnreadableResponse`` (502) for a response no replica would
    answer readably (a content coding the gateway cannot decode, an oversized SSE event):
    deterministic, so not retried and not the replica's failure.
    """
    loop = asyncio.get_running_loop()
    timeouts = attempt.pool.config.timeouts
    t_sent = time.monotonic()
    limit = attempt.deadline
    if attempt.stream:
        limit = min(loop.time() + timeouts.ttft_s, attempt.deadline)
    if attempt.read_deadline is not None:  # the client's read timeout: no byte until the answer
        limit = min(limit, attempt.read_deadline)
    headers = {
        "content-type": "application/json",
        "x-request-id": attempt.request_id,
        "accept": "text/event-stream" if attempt.stream else "application/json",
    }
    if attempt.extra_headers:
        headers.update(attempt.extra_headers)
    url = attempt.replica.url + (attempt.path or attempt.protocol.upstream_path
                                 or attempt.protocol.path)
    attempt.replica.inflight += 1
    attempt.replica.inflight_kv_tokens += attempt.kv_tokens
    if attempt.kv_tokens:
        attempt.replica.open_kv[id(attempt)] = (attempt.kv_tokens, attempt.output_cap, t_sent)
    resp: UpstreamReply | None = None
    try:
        async with asyncio.timeout_at(limit):
            resp = await upstream.post(url, attempt.payload, headers, timeouts.connect_s)
            if resp.status != 200:
                raise await _refusal(resp)
            if attempt.stream and not (attempt.json_ok and _is_json(resp)):
                batches = resp.event_batches()
                head = await _read_until_content(batches, attempt.protocol, attempt.heartbeat)
                return OpenedResponse(
                    attempt, resp, time.monotonic() - t_sent, head=head, batches=batches
                )
            raw = await resp.read()
            doc = _json_object(raw)
            return OpenedResponse(attempt, resp, time.monotonic() - t_sent, doc=doc)
    except BaseException as e:
        if resp is not None:
            resp.close()
        attempt.pool.release(attempt.replica, attempt.kv_tokens, id(attempt))
        typed = _typed_failure(e, attempt, limit)
        if typed is None:
            raise
        raise typed from None


async def _refusal(resp: UpstreamReply) -> GatewayError | RetryableFailure:
    """What an engine's answer other than 200 is: a ``RetryableFailure`` (an overload, a 5xx,
    408, 429, or a status that is no OpenAI answer), else its 4xx (``EngineClientError``)."""
    try:
        detail = await resp.read(MAX_ERROR_BODY_BYTES)
    except UpstreamUnreadable:
        detail = b""  # the status still says what happened
    retry_after = parse_retry_after(resp.headers.get("retry-after"))
    err = parse_engine_error(resp.status, detail, retry_after)
    if isinstance(err, UpstreamOverloaded):
        return RetryableFailure(OVERLOADED, err)
    if resp.status >= 500 or resp.status in RETRYABLE_STATUSES:
        return RetryableFailure(http_reason(resp.status), err)
    if resp.status < 400:  # 1xx/2xx/3xx other than 200: not an OpenAI answer
        return RetryableFailure(http_reason(resp.status), err)
    return err


def _typed_failure(e: BaseException, attempt: Attempt, limit: float) -> Exception | None:
    """The gateway's exception for ``e`` that ended ``attempt`` (``limit``: the loop time of
    the timeout in force), None to raise ``e`` as is."""
    if isinstance(e, TimeoutError):
        # which limit was in force, not the clock: timers may fire a little early
        if limit >= attempt.deadline:
            return UpstreamTimeout("total", attempt.total_s)
        if attempt.read_deadline is not None and limit >= attempt.read_deadline:
            # the client has stopped waiting: no other attempt would reach it
            return UpstreamTimeout("read", attempt.read_s or 0.0)
        ttft_s = attempt.pool.config.timeouts.ttft_s
        return RetryableFailure(Failure.TTFT_TIMEOUT, UpstreamTimeout("ttft", ttft_s))
    if isinstance(e, UpstreamConnectError):
        return RetryableFailure(
            Failure.CONNECT_TIMEOUT if e.timeout else Failure.CONNECT_ERROR,
            UpstreamError(f"cannot reach engine replica: {e}"),
        )
    if isinstance(e, UpstreamBrokenError):
        return RetryableFailure(Failure.BROKEN_STREAM,
                                UpstreamError(f"engine connection broke: {e}"))
    if isinstance(e, UpstreamUnreadable):
        return UnreadableResponse(f"engine response cannot be read: {e}")
    return None


async def _read_until_content(
    batches: AsyncIterator[list[SSEEvent]], protocol: Protocol,
    heartbeat: Callable[[], None] | None = None,
) -> list[SSEEvent]:
    """Data events up to the first content event (``protocol.head_kind``), plus any that
    arrived in the same read (comments dropped). Until then nothing is sent to the client, so a
    failure here can still be retried: an engine error event (``engine-error``; ``stream-4xx``
    when its code is a client's 4xx, ``is_client_fault``, ``error`` that ``EngineClientError``)
    or an event that is not one of the protocol's (``malformed``). ``heartbeat`` is called for
    each of the engine's keep-alives (comments, ``protocol.is_ping``) until then."""
    head: list[SSEEvent] = []
    async for batch in batches:
        found = False
        for ev in batch:
            if ev.data is None:
                if heartbeat is not None and ev.comment and not found:
                    heartbeat()
                continue
            if not found:
                kind, err = protocol.head_kind(ev)
                if kind == HEAD_ERROR:
                    assert err is not None
                    # the engine failed before any output: another replica may still serve.
                    # A 4xx code may be the request's fault or the replica's (vLLM gives any
                    # exception in generation code 400): failover tells them apart
                    usage = _event_usage(protocol, ev)
                    if isinstance(err, UpstreamOverloaded):
                        raise RetryableFailure(OVERLOADED, err, usage)
                    raise RetryableFailure(
                        STREAM_4XX if is_client_fault(err) else Failure.ENGINE_ERROR, err, usage)
                if kind == HEAD_MALFORMED:
                    raise RetryableFailure(
                        Failure.MALFORMED, UpstreamError("engine sent a malformed response")
                    )
                found = kind == HEAD_CONTENT
                if heartbeat is not None and kind == HEAD_FRAME and protocol.is_ping(ev):
                    heartbeat()
            head.append(ev)
        if found:
            return head
    raise UpstreamBrokenError("stream ended before the first content event")


def _event_usage(protocol: Protocol, ev: SSEEvent) -> Usage | None:
    """The usage an engine's error event reports (a Responses ``response.failed`` carries its
    response's ``usage``; a chat error chunk may carry ``usage``), None when it reports none."""
    try:
        doc = orjson.loads(ev.data or b"")
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict):
        return None
    inner = doc.get("response")
    return protocol.json_usage(inner if isinstance(inner, dict) else doc)


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """``Retry-After`` in seconds from ``now`` (Unix time, default the clock), None when
    absent or invalid. Both forms of RFC 9110 §10.2.3: delay-seconds (``120``; a decimal is
    accepted) and an HTTP-date (``Fri, 31 Dec 1999 23:59:59 GMT``, also the obsolete RFC 850
    and asctime forms), a date in the past meaning 0."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:  # asctime carries no zone: HTTP dates are always GMT
            when = when.replace(tzinfo=UTC)
        return max(0.0, when.timestamp() - (time.time() if now is None else now))
    return seconds if seconds >= 0 and math.isfinite(seconds) else None


def _is_json(resp: UpstreamReply) -> bool:
    """True when the engine answered a streamed request with a JSON body (it ignored
    ``stream``, as some OpenAI-compatible servers and proxies do)."""
    kind = resp.headers.get("content-type") or ""
    return kind.startswith("application/json")


def _json_object(raw: bytes) -> dict:
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict):
        raise RetryableFailure(Failure.MALFORMED,
                               UpstreamError("engine sent a malformed response"))
    return doc
