"""How an upstream attempt can fail, and what each kind of failure means: one enumeration
(``Failure``) and one table of its properties (``TRAITS``), read by the attempt (a replica's
fault for outlier ejection), the failover loop (the body rule, the retry budget), the retry
policy and the mid-stream resume (what may be continued, what counts against the replica).

A failure's *reason* is the short slug the metrics, ``rec.retries`` and ``x-speedgate-fallback``
carry (``ttft-timeout``, ``http-503``); ``failure_kind(reason)`` sorts a reason into its kind
(every ``http-<status>`` into one of four kinds by status).

The properties (each a yes/no):

- ``replica_fault``: the failure says the replica is unhealthy (outlier ejection). A busy
  engine (408, 429, an overload) is not broken; a ``stream-4xx`` is the replica's only once
  another replica served the request (the failover's diagnosis); a divergence of a resumed
  stream is the token healing's; the request's own deadline and an unreadable response are
  nobody's.
- ``retry_elsewhere``: another replica may still answer (before the answer: a retry; after
  content: a continuation).
- ``spends_budget``: a retry after it takes from the pool's retry budget. A refused connection
  cost the engine nothing; the one diagnosis retry of a ``stream-4xx`` is free, or a replica
  that fails everything would exhaust the budget and never be ejected.
- ``body_suspect``: the body may have caused it (an engine bug the body triggers): the body
  rule holds the count back until another replica's outcome tells (``gateway.upstream.verdict``).
- ``resumable``: a stream that broke this way after content may be continued elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Failure(StrEnum):
    """The kinds of upstream failure (values are the reasons of the fixed-name kinds)."""

    CONNECT_ERROR = "connect-error"  # refused, reset, DNS
    CONNECT_TIMEOUT = "connect-timeout"
    TTFT_TIMEOUT = "ttft-timeout"  # no first content event in ``ttft_s``
    BROKEN_STREAM = "broken-stream"  # the connection broke
    EOF = "eof"  # the stream ended before its protocol's last event
    STALL_TIMEOUT = "stall-timeout"  # no event for ``stall_s`` once the stream flowed
    MALFORMED = "malformed"  # an event or body that is not the protocol's
    ENGINE_ERROR = "engine-error"  # an in-stream error event whose code is not a client's 4xx
    STREAM_4XX = "stream-4xx"  # an in-stream error event with a client's 4xx, before content
    OVERLOADED = "overloaded"  # HTTP 529 or an ``overloaded_error``
    HTTP_500 = "http-500"
    HTTP_5XX = "http-5xx"  # any other 5xx (reason ``http-<status>``)
    HTTP_BUSY = "http-busy"  # 408, 429 (reason ``http-408``, ``http-429``)
    HTTP_UNEXPECTED = "http-unexpected"  # 1xx, 2xx other than 200, 3xx
    TOTAL_TIMEOUT = "total-timeout"  # the request's own deadline
    UNREADABLE = "unreadable"  # a coding or an event size no replica would answer readably
    CLIENT_ERROR = "client-error"  # the engine's in-stream 4xx after content
    DIVERGED = "diverged"  # a continuation's regenerated word came back otherwise


@dataclass(frozen=True, slots=True)
class Traits:
    """What one kind of failure means (module docstring)."""

    replica_fault: bool
    retry_elsewhere: bool
    spends_budget: bool
    body_suspect: bool
    resumable: bool


def _t(fault: int, elsewhere: int, spends: int, suspect: int, resumable: int) -> Traits:
    return Traits(bool(fault), bool(elsewhere), bool(spends), bool(suspect), bool(resumable))


#: The one table: kind → (replica's fault, retry elsewhere, spends budget, body suspect,
#: resumable). A client's 4xx after content is not resumed (the engine refused) yet counts,
#: since a client's invalid request fails before generation (vLLM answers any exception in
#: generation with code 400).
TRAITS: dict[Failure, Traits] = {
    #                                 fault elsewhere spends suspect resumable
    Failure.CONNECT_ERROR: _t(1, 1, 0, 0, 1),
    Failure.CONNECT_TIMEOUT: _t(1, 1, 1, 0, 1),
    Failure.TTFT_TIMEOUT: _t(1, 1, 1, 0, 1),
    Failure.BROKEN_STREAM: _t(1, 1, 1, 0, 1),
    Failure.EOF: _t(1, 1, 1, 0, 1),
    Failure.STALL_TIMEOUT: _t(1, 1, 1, 0, 1),
    Failure.MALFORMED: _t(1, 1, 1, 0, 1),
    Failure.ENGINE_ERROR: _t(1, 1, 1, 1, 1),
    Failure.STREAM_4XX: _t(0, 1, 0, 0, 0),
    Failure.OVERLOADED: _t(0, 1, 1, 0, 1),
    Failure.HTTP_500: _t(1, 1, 1, 1, 1),
    Failure.HTTP_5XX: _t(1, 1, 1, 0, 1),
    Failure.HTTP_BUSY: _t(0, 1, 1, 0, 1),
    Failure.HTTP_UNEXPECTED: _t(1, 1, 1, 0, 1),
    Failure.TOTAL_TIMEOUT: _t(0, 0, 0, 0, 0),
    Failure.UNREADABLE: _t(0, 0, 0, 0, 0),
    Failure.CLIENT_ERROR: _t(1, 0, 0, 0, 0),
    Failure.DIVERGED: _t(0, 1, 0, 0, 1),
}

_BUSY_STATUSES = frozenset({408, 429})


def http_reason(status: int) -> str:
    """The reason of an engine's HTTP ``status`` other than 200 (``http-503``)."""
    return f"http-{status}"


def failure_kind(reason: str) -> Failure:
    """The kind of a failure ``reason``; ``http-<status>`` by its status (module docstring).
    Raises ``ValueError`` for a reason no kind has."""
    if reason.startswith("http-") and reason[5:].isdigit():
        status = int(reason[5:])
        if status == 500:
            return Failure.HTTP_500
        if status in _BUSY_STATUSES:
            return Failure.HTTP_BUSY
        return Failure.HTTP_5XX if status >= 500 else Failure.HTTP_UNEXPECTED
    return Failure(reason)


def traits(reason: str) -> Traits:
    """``TRAITS`` of the kind of ``reason``."""
    return TRAITS[failure_kind(reason)]
