"""Retry, backoff, budget, outlier ejection, deadline and content-event policies (pure)."""

import random
from types import SimpleNamespace

import pytest

from gateway.config import OutlierConfig, RetryConfig
from gateway.errors import InvalidRequest, UpstreamError
from gateway.fleet.outlier import OutlierState, max_ejected, record_failure, record_success
from gateway.fleet.retry_budget import RetryBudget
from gateway.protocols.openai.chat import is_content
from gateway.upstream.attempt import RetryableFailure, parse_retry_after
from gateway.upstream.deadline import header_timeout_s, total_timeout_s
from gateway.upstream.failover import _note_failure
from gateway.upstream.retry import full_jitter_backoff_s


def test_full_jitter_is_bounded_by_exponential_cap():
    cfg = RetryConfig(backoff_base_s=0.1, backoff_max_s=0.5)
    rng = random.Random(1)
    for n, cap in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.5), (10, 0.5)]:
        samples = [full_jitter_backoff_s(n, cfg, rng) for _ in range(200)]
        assert all(0 <= s <= cap for s in samples)
        assert max(samples) > cap * 0.8  # the whole range is used


def test_retry_budget_percent_plus_floor_in_window():
    b = RetryBudget(RetryConfig(budget_percent=20, budget_min_retries=3, budget_window_s=10))
    for i in range(50):
        b.record_request(float(i) / 10)
    assert b.allowed(5.0) == 10 + 3
    granted = sum(b.try_acquire(5.0) for _ in range(20))
    assert granted == 13 and b.exhausted == 7
    # the window slides: at t=20 the old requests and retries are gone, the floor remains
    assert b.allowed(20.0) == 3
    assert sum(b.try_acquire(20.0) for _ in range(5)) == 3


def test_item3_retry_budget_first_retry_after_a_quiet_period_is_granted():
    """The window is trimmed before the retries in it are counted. A burst
    of retries long past must not refuse the first retry after a quiet period (it answered
    a 429 with Retry-After: 1 in 30 ms instead of retrying)."""
    b = RetryBudget(RetryConfig(budget_percent=20, budget_min_retries=3, budget_window_s=10))
    for _ in range(10):
        b.record_request(0.0)
    assert sum(b.try_acquire(0.0) for _ in range(10)) == 2 + 3  # the burst spends it all
    b.record_request(30.0)  # quiet for three windows; no allowed() call in between
    assert b.try_acquire(30.0)
    assert b.exhausted == 5


def test_outlier_ejects_after_consecutive_failures_with_growing_time():
    cfg = OutlierConfig(consecutive_failures=3, base_ejection_s=10, max_ejection_s=25,
                        probation_successes=2)
    s = OutlierState()
    assert not record_failure(s, cfg, 0.0, True)
    assert not record_failure(s, cfg, 0.1, True)
    assert record_failure(s, cfg, 0.2, True)
    assert s.is_ejected(5.0) and not s.is_ejected(10.3)
    # on probation after re-admission: one failure re-ejects, for twice as long
    assert record_failure(s, cfg, 11.0, True)
    assert s.ejected_until == pytest.approx(31.0)
    assert record_failure(s, cfg, 32.0, True)
    assert s.ejected_until == pytest.approx(32.0 + 25)  # capped at max_ejection_s
    # probation ends after enough successes, and the multiplier resets
    record_success(s, cfg)
    record_success(s, cfg)
    assert not s.probation and s.times_ejected == 0
    assert s.ejections_total == 3


def test_success_resets_the_streak_and_pool_cap_blocks_ejection():
    cfg = OutlierConfig(consecutive_failures=2)
    s = OutlierState()
    record_failure(s, cfg, 0, True)
    record_success(s, cfg)
    assert not record_failure(s, cfg, 1, True)
    assert not record_failure(s, cfg, 2, False)  # would exceed max_ejection_percent
    assert not s.is_ejected(2)
    assert max_ejected(4, OutlierConfig(max_ejection_percent=50)) == 2
    assert max_ejected(1, OutlierConfig(max_ejection_percent=50)) == 1


def test_deadline_headers():
    assert header_timeout_s(None, None) is None
    assert header_timeout_s("2.5", "600") == 2.5
    assert header_timeout_s(None, "600") == 600
    assert header_timeout_s(None, "bogus") is None
    for bad in ("0", "-1", "abc", "nan", "inf"):
        with pytest.raises(InvalidRequest):
            header_timeout_s(bad, None)
    assert total_timeout_s(60, None) == 60
    assert total_timeout_s(60, 5) == 5
    assert total_timeout_s(60, 600) == 60  # headers shorten, never extend


@pytest.mark.parametrize(
    ("doc", "content"),
    [
        ({"choices": [{"delta": {"role": "assistant", "content": ""}}]}, False),
        ({"choices": [{"delta": {"content": "Hel"}}]}, True),
        ({"choices": [{"delta": {"tool_calls": [{"index": 0}]}}]}, True),
        ({"choices": [{"delta": {}, "finish_reason": "stop"}]}, True),
        ({"choices": [{"text": "", "finish_reason": None}]}, False),
        ({"choices": [{"text": "x"}]}, True),
        ({"choices": [], "usage": {}}, True),
        ({"error": {"message": "x"}}, True),
    ],
)
def test_first_content_event(doc, content):
    assert is_content(doc) is content


def test_retry_after_and_replica_fault():
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # a date in the past
    assert parse_retry_after(None) is None
    assert not RetryableFailure("http-429", UpstreamError("x")).replica_fault
    assert RetryableFailure("http-503", UpstreamError("x")).replica_fault


def test_failed_fresh_attempt_keeps_the_resume_notes_unless_a_tier_changed():
    """A failover that fails in the plan's first tier leaves an earlier ``rec.fallback`` (the
    resume notes of this request's broken attempt) as it was; one that moved tiers says so."""
    plan = SimpleNamespace(chain=[SimpleNamespace(tier="fast"), SimpleNamespace(tier="standard")],
                           reason="requested")
    rec = SimpleNamespace(fallback="fast:resume-broken-stream")
    _note_failure(rec, ["fast:no-usable-replica"], plan, "fast")
    assert rec.fallback == "fast:resume-broken-stream"
    _note_failure(rec, ["fast:no-usable-replica", "standard:http-503"], plan, "standard")
    assert rec.fallback == "fast:no-usable-replica,standard:http-503"
    rec = SimpleNamespace(fallback=None)
    _note_failure(rec, ["fast:connect-error", "fast:replicas-exhausted"], plan, "fast")
    assert rec.fallback == "fast:connect-error,fast:replicas-exhausted"
