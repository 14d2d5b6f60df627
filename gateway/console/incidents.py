"""Retries, fallbacks and timeouts of one finished request, read from its record. Pure.

The failover step (``gateway.upstream.failover``) leaves on the ``RequestRecord``: ``retries``
(the failure slug of each retried attempt, in order), ``fallback`` (every failure of the
request as ``tier:reason``, comma-separated, set when a pool other than the first served or
when the request failed), ``attempts`` and the ``outcome``. From these:

- **retry**: one per retried attempt, with the tier it ran on and the failure retried
  (``ttft-timeout``, ``connect-error``, ``http-503``…); an attempt failure was retried when the
  next failure listed is on the same tier (each pool is visited once), the last one when the
  record counts one more retry than those.
- **fallback**: one per request that moved to another tier: ``from`` the first tier tried,
  ``to`` the tier that served (or the last one tried), ``reason`` the last failure on the first
  tier (``replicas-exhausted``, ``retry-budget-exhausted``, ``no-usable-replica``,
  ``tier-unavailable``, or the failure slug).
- **timeout**: one per ``connect-timeout`` or ``ttft-timeout`` attempt (stage ``connect`` /
  ``ttft``); plus ``total`` when the request's deadline ended an attempt before the response
  started, and ``mid-stream`` when a started stream ended on a timeout (the stall or the total
  deadline: ``speedgate_timeouts_total`` has the exact stage).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

Kind = Literal["retry", "fallback", "timeout"]

#: Slugs in the failure list that are not attempts (a pool given up, a tier not configured).
MARKERS = frozenset(
    {"replicas-exhausted", "no-usable-replica", "retry-budget-exhausted", "tier-unavailable"}
)
TIMEOUT_OUTCOME = "upstream_timeout"  # ``gateway.errors.UpstreamTimeout.code``


class RecordView(Protocol):
    """The fields read of ``gateway.telemetry.record.RequestRecord``."""

    served_tier: str | None
    asked_tier: str | None
    retries: list[str]
    fallback: str | None
    attempts: int
    outcome: str | None
    response_started: bool


@dataclass(frozen=True, slots=True)
class Incident:
    """One retry, fallback or timeout: ``tier`` it happened on (a fallback's from-tier),
    ``reason`` (slug), ``to_tier`` for a fallback."""

    kind: Kind
    tier: str | None
    reason: str
    to_tier: str | None = None

    @property
    def where(self) -> str:
        """The tier, or ``from→to`` for a fallback ("" when unknown)."""
        if self.kind == "fallback":
            return f"{self.tier or '?'}→{self.to_tier or '?'}"
        return self.tier or ""


def failures(rec: RecordView) -> list[tuple[str | None, str]]:
    """The request's failure list as ``(tier, slug)``, oldest first."""
    if rec.fallback:
        out: list[tuple[str | None, str]] = []
        for item in rec.fallback.split(","):
            tier, sep, slug = item.partition(":")
            out.append((tier, slug) if sep else (None, tier))
        return out
    served: str | None = rec.served_tier or rec.asked_tier
    return [(served, r) for r in rec.retries]


def incidents_of(rec: RecordView) -> list[Incident]:
    """Every retry, fallback and timeout of one finished request (see the module doc)."""
    if not rec.retries and not rec.fallback and rec.outcome != TIMEOUT_OUTCOME:
        return []  # the common case, checked first: nothing happened
    items = failures(rec)
    out: list[Incident] = []
    attempt_failures = retries = 0
    for i, (tier, slug) in enumerate(items):
        if slug in MARKERS:
            continue
        attempt_failures += 1
        if slug.endswith("-timeout"):
            out.append(Incident("timeout", tier, slug.removesuffix("-timeout")))
        nxt = items[i + 1] if i + 1 < len(items) else None
        if nxt is not None:
            retried = nxt[0] == tier and nxt[1] not in MARKERS
        else:  # the last failure: retried when the record counts one more retry
            retried = retries < len(rec.retries)
        if retried:
            retries += 1
            out.append(Incident("retry", tier, slug))
    if rec.outcome == TIMEOUT_OUTCOME:
        if rec.response_started:
            out.append(Incident("timeout", rec.served_tier, "mid-stream"))
        elif rec.attempts > attempt_failures:  # the deadline ended an attempt
            out.append(Incident("timeout", _last_tier(items, rec), "total"))
    fb = _fallback(items, rec)
    if fb is not None:
        out.append(fb)
    return out


def _last_tier(items: list[tuple[str | None, str]], rec: RecordView) -> str | None:
    for tier, _ in reversed(items):
        if tier is not None:
            return tier
    return rec.served_tier or rec.asked_tier


def _fallback(items: list[tuple[str | None, str]], rec: RecordView) -> Incident | None:
    if not items:
        return None
    first_tier, first_slug = items[0]
    if first_tier is None:  # "tier-unavailable": the asked tier is not configured
        to = rec.served_tier or _last_tier(items, rec)
        return Incident("fallback", rec.asked_tier, first_slug, to)
    to = rec.served_tier or _last_tier(items, rec)
    if to is None or to == first_tier:
        return None
    reason = next(slug for tier, slug in reversed(items) if tier == first_tier)
    return Incident("fallback", first_tier, reason, to)
