"""The recorder the accounting step feeds: deterministic windows under an injected clock."""

from __future__ import annotations

import pytest

from gateway.common.usage import Usage
from gateway.config import ConsoleConfig
from gateway.console.recorder import ConsoleRecorder
from gateway.console.sketch import RELATIVE_ACCURACY
from gateway.telemetry.histograms import GapTimer
from gateway.telemetry.record import RequestRecord


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _rec(tier: str | None = "fast", *, ttft: float = 0.1, completion: int = 11,
         decode_s: float = 0.5, outcome: str = "ok", status: int = 200, asked: str | None = None,
         session: str | None = None, key: str | None = None, cost: float = 0.001,
         **extra) -> RequestRecord:
    rec = RequestRecord(request_id="rid", path="/v1/chat/completions")
    rec.model, rec.asked_tier, rec.served_tier = "m", asked or tier, tier
    rec.stream, rec.outcome, rec.status = True, outcome, status
    rec.session_id, rec.key_id = session, key
    if tier is not None:
        rec.ttft_s = ttft
        rec.usage = Usage(prompt=100, completion=completion, cached=60)
        rec.cost_usd = cost
        itl = GapTimer()
        for i in range(completion):
            itl.tick(10.0 + decode_s * i / max(1, completion - 1))
        rec.itl = itl
    for k, v in extra.items():
        setattr(rec, k, v)
    return rec


def test_pool_window_counts_latency_speed_tokens_and_cost() -> None:
    clock = Clock()
    r = ConsoleRecorder(ConsoleConfig(window_s=60, step_s=5), clock=clock)
    ttfts = [0.05 * (i + 1) for i in range(20)]  # 50 ms … 1 s
    for i, ttft in enumerate(ttfts):
        r.observe(_rec("fast", ttft=ttft, completion=11, decode_s=0.5))  # 10 tokens / 0.5 s
        clock.t += 1.0
        if i % 5 == 0:
            r.observe(_rec("standard", completion=21, decode_s=2.0))  # 20 / 2 s = 10 tok/s
    w = r.pool_window("m/fast", clock.t)
    assert (w.requests, w.ok, w.errors) == (20, 20, 0)
    assert w.ttft.count == 20
    assert w.ttft.quantile(0.5) == pytest.approx(0.5, rel=RELATIVE_ACCURACY)  # rank 9 of 20
    assert w.ttft.quantile(0.95) == pytest.approx(0.95, rel=RELATIVE_ACCURACY)  # rank 18
    assert w.tps.quantile(0.5) == pytest.approx(20.0, rel=RELATIVE_ACCURACY)
    assert (w.prompt_tokens, w.cached_tokens, w.completion_tokens) == (2000, 1200, 220)
    assert w.cost_usd == pytest.approx(0.02)
    s = r.pool_window("m/standard", clock.t)
    assert s.requests == 4 and s.tps.quantile(0.5) == pytest.approx(10.0, rel=RELATIVE_ACCURACY)


def test_windows_forget_what_is_older_than_the_window() -> None:
    clock = Clock(0.0)
    r = ConsoleRecorder(ConsoleConfig(window_s=60, step_s=5), clock=clock)
    r.observe(_rec("fast"))
    clock.t = 30.0
    r.observe(_rec("fast"))
    assert r.pool_window("m/fast", 59.0).requests == 2
    assert r.pool_window("m/fast", 61.0).requests == 1  # step 0 left the window
    # a 35 s window at t = 61 is steps 6..12 (30 s … 65 s): it holds the one at t = 30
    assert r.pool_window("m/fast", 61.0, steps=r.steps_for(35)).requests == 1
    assert r.pool_window("m/fast", 61.0, steps=r.steps_for(30)).requests == 0
    assert r.pool_window("m/fast", 95.0).requests == 0
    assert r.outcome_counts(95.0) == {}


def test_covered_seconds_and_window_steps() -> None:
    clock = Clock(1000.0)
    r = ConsoleRecorder(ConsoleConfig(window_s=60, step_s=5), clock=clock)
    assert r.covered_s(1010.0) == pytest.approx(10.0)  # up for 10 s only
    assert r.covered_s(2002.0) == pytest.approx(57.0)  # 11 whole steps + 2 s of the current
    assert r.steps_for(None) == 12 and r.steps_for(30) == 6 and r.steps_for(1) == 1
    assert r.steps_for(10_000) == 12


def test_outcome_classes_and_unserved_requests() -> None:
    clock = Clock()
    r = ConsoleRecorder(clock=clock)
    r.observe(_rec(None, asked="fast", outcome="no_healthy_replica", status=503))
    r.observe(_rec("fast", outcome="upstream_error", status=200, response_started=True))
    r.observe(_rec("fast", outcome="client_disconnected", status=499))
    unauth = RequestRecord(request_id="x", path="/v1/chat/completions")
    unauth.status, unauth.outcome = 401, "invalid_api_key"
    r.observe(unauth)  # no model: gateway-wide counts only
    assert r.outcome_counts(clock.t) == {"error": 2, "disconnect": 1, "client_error": 1}
    w = r.pool_window("m/fast", clock.t)
    assert (w.requests, w.errors, w.disconnects, w.ok) == (3, 2, 1, 0)
    assert w.tps.count == 0  # failed streams give no speed sample


def test_auto_reasons_incidents_and_sessions() -> None:
    clock = Clock()
    r = ConsoleRecorder(ConsoleConfig(recent_events=3), clock=clock)
    for _ in range(3):
        r.observe(_rec("fast", asked="auto", auto_reason="fast-faster", session="s1", key="k"))
    r.observe(_rec("standard", asked="auto", auto_reason="fast-saturated", session="s2"))
    for _ in range(5):
        r.observe(_rec("standard", asked="fast", attempts=2, retries=["connect-error"],
                       fallback="fast:connect-error,fast:http-503,fast:replicas-exhausted"))
    assert r.auto_reasons("m", clock.t) == {"fast:fast-faster": 3, "standard:fast-saturated": 1}
    counts = r.incident_counts(clock.t)
    assert counts == {("retry", "fast", "connect-error"): 5,
                      ("fallback", "fast→standard", "replicas-exhausted"): 5}
    assert len(r.recent) == 3  # bounded
    assert r.recent[-1].incidents[0].kind == "retry"
    top = r.sessions.top(clock.t, 60, 5, "requests_per_min")
    assert [(s.session_id, s.key_id, s.turns) for s in top] == [("s1", "k", 3), ("s2", None, 1)]


def test_memory_stays_bounded_under_heavy_traffic() -> None:
    clock = Clock(0.0)
    r = ConsoleRecorder(ConsoleConfig(window_s=60, step_s=5, max_sessions=50, recent_events=10),
                        clock=clock)
    for i in range(20_000):
        clock.t = i * 0.01  # 100 requests/s for 200 s
        r.observe(_rec("fast", ttft=0.01 + (i % 97) / 100, session=f"s{i}",
                       retries=["http-503"], attempts=2))
    assert len(r.sessions) == 50 and len(r.recent) == 10
    ring = r.pools["m/fast"]
    assert len([b for b in ring._slots if b is not None]) == ring.n == 12
    assert all(len(b.ttft.buckets) < 400 for b in ring._slots if b is not None)
    assert r.pool_window("m/fast", clock.t).requests == 11 * 500 + 500  # the last 60 s
