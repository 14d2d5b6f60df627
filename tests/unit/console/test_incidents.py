"""Retries, fallbacks and timeouts read from a finished request's record, for the failure
lists ``gateway.upstream.failover`` leaves (one row per shape it produces)."""

from __future__ import annotations

import pytest

from gateway.console.incidents import Incident, incidents_of
from gateway.telemetry.record import RequestRecord


def _rec(**fields) -> RequestRecord:
    rec = RequestRecord(request_id="r", path="/v1/chat/completions")
    for k, v in fields.items():
        setattr(rec, k, v)
    return rec


CASES = {
    "clean": (dict(asked_tier="fast", served_tier="fast", attempts=1, outcome="ok"), []),
    "retried-ttft-then-ok": (
        dict(asked_tier="fast", served_tier="fast", attempts=2, retries=["ttft-timeout"],
             outcome="ok"),
        [Incident("timeout", "fast", "ttft"), Incident("retry", "fast", "ttft-timeout")],
    ),
    "fast-exhausted-fell-back": (
        dict(asked_tier="fast", served_tier="standard", attempts=3,
             retries=["connect-error"], outcome="ok",
             fallback="fast:connect-error,fast:http-503,fast:replicas-exhausted"),
        [Incident("retry", "fast", "connect-error"),
         Incident("fallback", "fast", "replicas-exhausted", "standard")],
    ),
    "everything-failed": (
        dict(asked_tier="fast", served_tier=None, attempts=4, status=502,
             retries=["connect-error", "connect-error"], outcome="upstream_error",
             fallback="fast:connect-error,fast:connect-error,standard:connect-error,"
                      "standard:connect-error"),
        [Incident("retry", "fast", "connect-error"), Incident("retry", "standard",
                                                              "connect-error"),
         Incident("fallback", "fast", "connect-error", "standard")],
    ),
    "deadline-during-the-only-attempt": (
        dict(asked_tier="standard", served_tier=None, attempts=1, status=504,
             outcome="upstream_timeout"),
        [Incident("timeout", "standard", "total")],
    ),
    "ttft-timeout-was-the-last-failure": (
        dict(asked_tier="fast", served_tier=None, attempts=1, status=504,
             outcome="upstream_timeout", fallback="fast:ttft-timeout"),
        [Incident("timeout", "fast", "ttft")],
    ),
    "deadline-after-a-retried-ttft-timeout": (
        dict(asked_tier="fast", served_tier=None, attempts=2, status=504,
             retries=["ttft-timeout"], outcome="upstream_timeout", fallback="fast:ttft-timeout"),
        [Incident("timeout", "fast", "ttft"), Incident("retry", "fast", "ttft-timeout"),
         Incident("timeout", "fast", "total")],
    ),
    "stall-mid-stream": (
        dict(asked_tier="fast", served_tier="fast", attempts=1, status=200, stream=True,
             response_started=True, outcome="upstream_timeout"),
        [Incident("timeout", "fast", "mid-stream")],
    ),
    "asked-tier-not-configured": (
        dict(asked_tier="fast", served_tier="standard", attempts=1, outcome="ok",
             fallback="tier-unavailable"),
        [Incident("fallback", "fast", "tier-unavailable", "standard")],
    ),
    "budget-spent": (
        dict(asked_tier="fast", served_tier="standard", attempts=2, outcome="ok",
             fallback="fast:http-503,fast:retry-budget-exhausted"),
        [Incident("fallback", "fast", "retry-budget-exhausted", "standard")],
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_incidents_of_each_failover_shape(name: str) -> None:
    fields, want = CASES[name]
    got = incidents_of(_rec(**fields))
    assert sorted(got, key=repr) == sorted(want, key=repr)


def test_retry_count_matches_the_records_retries() -> None:
    """Every shape above: the retries found are exactly the retries the failover made."""
    for fields, _ in CASES.values():
        rec = _rec(**fields)
        retried = [i.reason for i in incidents_of(rec) if i.kind == "retry"]
        assert retried == list(rec.retries)


def test_where_names_a_fallbacks_two_tiers() -> None:
    assert Incident("fallback", "fast", "x", "standard").where == "fast→standard"
    assert Incident("retry", "fast", "x").where == "fast"
    assert Incident("timeout", None, "total").where == ""
