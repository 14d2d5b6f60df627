"""What a failed attempt means for its request, before the answer: go on, answer now, and whose
failure to record (outlier ejection). Pure: the held-back failures in, a ``Verdict`` out; the
failover loop (``gateway.upstream.failover``) does the I/O and the recording. ``next_attempt``
(``gateway.upstream.retry``) then says where the next attempt goes, or that the pool stops.

Two failures are held back rather than recorded at once, each until another replica's outcome
tells whose fault it was (a ``Diagnosis``):

- **The stream-4xx diagnosis.** An in-stream error event with a client's 4xx code before any
  content is ambiguous: vLLM gives every exception in generation code 400 (``serving_chat``'s
  stream generator answers any exception with ``create_streaming_error_response``, default
  ``BAD_REQUEST``), so a broken replica sends it for every request. It is asked once more on
  another replica of the pool without spending the retry budget (``failures.TRAITS``). If that
  one answers, the first replica's failure is recorded; if it sends an in-stream 4xx too, that
  4xx is the client's answer (``answer="client-error"``) and no failure is recorded; with no
  other usable replica the 4xx is answered and nothing recorded.
- **The body rule.** A failure the body may have caused (``Traits.body_suspect``: an engine's
  500, an in-stream error event that is not a 4xx) is not recorded at once: the request is
  retried on another replica as usual; if that one fails the same way, the body is at fault
  (``answer="body-fault"``): no more retries, the error is answered, neither failure recorded.
  If another replica serves it, fails in another way, or nothing is left to ask, the first
  failure is recorded. So a body can fail at most two replicas and count against none, and a
  replica that fails what others serve is still ejected.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.fleet.pools import Pool, Replica
from gateway.upstream.failures import TRAITS, Failure


@dataclass(frozen=True, slots=True)
class Failed:
    """One replica's failure of this request: ``kind`` on ``replica`` of ``pool``."""

    pool: Pool
    replica: Replica
    kind: Failure


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """The failures held back: ``stream_4xx`` (the replica whose in-stream 4xx awaits another
    replica's answer) and ``body`` (the first replica of a failure the body may have caused)."""

    stream_4xx: Failed | None = None
    body: Failed | None = None


@dataclass(frozen=True, slots=True)
class Verdict:
    """A failure's meaning: ``diagnosis`` what is held back from now on; ``charge`` the
    failures to record now, in order (outlier ejection); ``answer`` None to go on, else the rule
    that ends the request with this failure's error (``body-fault``, ``client-error``)."""

    diagnosis: Diagnosis
    charge: tuple[Failed, ...] = ()
    answer: str | None = None


def after_failure(held: Diagnosis, failed: Failed) -> Verdict:
    """The verdict on ``failed`` given what was ``held`` back (module docstring)."""
    body = held.body
    if body is not None and body.kind is failed.kind:  # two replicas failed this body alike
        return Verdict(Diagnosis(held.stream_4xx), answer="body-fault")
    charge = [body] if body is not None else []  # failed otherwise: the first one counts
    stream_4xx = held.stream_4xx
    if failed.kind is Failure.STREAM_4XX:
        if stream_4xx is not None:  # two replicas refused it alike: the request's fault
            return Verdict(Diagnosis(stream_4xx), tuple(charge), answer="client-error")
        stream_4xx = failed
    traits = TRAITS[failed.kind]
    if traits.replica_fault and not traits.body_suspect:
        charge.append(failed)
    return Verdict(Diagnosis(stream_4xx, failed if traits.body_suspect else None),
                   tuple(charge))


def after_success(held: Diagnosis) -> tuple[Failed, ...]:
    """The failures to record once another replica served the request: what the stream-4xx
    suspect refused and what the body suspect failed were theirs."""
    return tuple(f for f in (held.stream_4xx, held.body) if f is not None)


def after_all(held: Diagnosis) -> tuple[Failed, ...]:
    """The failures to record when no attempt is left: a body suspect nobody else was asked
    about counts as before the rule; a stream-4xx nobody could check is answered as is."""
    return (held.body,) if held.body is not None else ()
