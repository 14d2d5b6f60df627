"""``GET /v1/console/state``'s document, built from live objects with injected clocks: shape,
units, figures after known traffic, the sick-replica marker, and no secrets."""

from __future__ import annotations

import json
from types import SimpleNamespace

import orjson
import pytest

from gateway.common.usage import Usage
from gateway.config import load_config
from gateway.console.recorder import ConsoleRecorder
from gateway.console.sketch import RELATIVE_ACCURACY
from gateway.console.snapshot import ConsoleSources, console_snapshot
from gateway.fleet.pools import PoolRegistry
from gateway.plan.auto.service import AutoTier
from gateway.telemetry.cost import cost_usd
from gateway.telemetry.histograms import GapTimer
from gateway.telemetry.record import RequestRecord
from gateway.upstream.load_scraper import apply_engine_metrics

SECRET = "engine-password-7"
WALL0 = 1_800_000_000.0


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _config():
    prices = {
        "standard": {"input_per_mtok_usd": 1.0, "cached_input_per_mtok_usd": 0.1,
                     "output_per_mtok_usd": 2.0},
        "fast": {"input_per_mtok_usd": 2.0, "cached_input_per_mtok_usd": 0.2,
                 "output_per_mtok_usd": 6.0},
    }
    return load_config(
        console={"window_s": 60, "step_s": 5, "top_sessions": 3},
        models={"m": {"fallback": {"fast": "standard"}, "tiers": {
            t: {"served_model_name": "m", "prices": prices[t],
                "endpoints": [f"http://admin:{SECRET}@10.0.0.{i + (10 if t == 'fast' else 0)}:8000"
                              for i in range(2)]}
            for t in ("standard", "fast")}}},
    )


@pytest.fixture
def world():
    config = _config()
    pools = PoolRegistry(config)
    mono = Clock(5000.0)
    wall = Clock(WALL0)
    rec = ConsoleRecorder(config.console, clock=mono)
    auto = AutoTier(config, pools)
    src = ConsoleSources(config, pools, rec, auto, auth_enabled=True, clock=mono, wall=wall)
    return SimpleNamespace(config=config, pools=pools, rec=rec, src=src, mono=mono, wall=wall)


def _finished(config, pools, tier: str, ttft: float, *, session: str | None = None,
              asked: str | None = None, reason: str | None = None) -> RequestRecord:
    r = RequestRecord(request_id="req", path="/v1/chat/completions")
    r.model, r.asked_tier, r.served_tier, r.auto_reason = "m", asked or tier, tier, reason
    r.stream, r.status, r.outcome, r.ttft_s = True, 200, "ok", ttft
    r.session_id, r.key_id = session, "team-a" if session else None
    r.usage = Usage(prompt=1000, completion=21, cached=500)
    r.cost_usd = cost_usd(r.usage, pools.get("m", tier).config.prices)  # type: ignore[union-attr]
    r.itl = GapTimer()
    for i in range(21):
        r.itl.tick(i * (0.02 if tier == "fast" else 0.05))  # 20 tokens in 0.4 s / 1.0 s
    return r


def test_shape_and_units_after_known_traffic(world) -> None:
    w = world
    config, pools, rec, src, mono, wall = w.config, w.pools, w.rec, w.src, w.mono, w.wall
    fast_ttfts = [0.010 * (i + 1) for i in range(10)]
    for i, t in enumerate(fast_ttfts):
        rec.observe(_finished(config, pools, "fast", t, session="s-1", asked="auto",
                              reason="fast-faster"))
        rec.observe(_finished(config, pools, "standard", 0.2, session=f"s-{i % 2 + 2}"))
        mono.t += 1.0
        wall.t += 1.0
    doc = orjson.loads(orjson.dumps(console_snapshot(src)))  # JSON-serialisable as is
    assert set(doc) == {"object", "version", "generated_at", "window_s", "step_s", "covered_s",
                        "refresh_s", "gateway", "models", "sessions", "cost", "incidents"}
    assert doc["object"] == "console.state" and doc["generated_at"] == wall.t
    assert (doc["window_s"], doc["step_s"], doc["covered_s"]) == (60.0, 5.0, 10.0)
    assert doc["gateway"]["requests"] == {"ok": 20, "error": 0, "client_error": 0,
                                          "disconnect": 0}
    assert doc["gateway"]["auth_enabled"] is True and doc["gateway"]["status"] == "ready"
    (m,) = doc["models"]
    fast, std = m["tiers"]["fast"], m["tiers"]["standard"]
    assert fast["requests"] == 10 and fast["requests_per_s"] == 1.0
    assert fast["ttft_s"]["p50"] == pytest.approx(0.05, rel=RELATIVE_ACCURACY)  # rank 4 of 10
    assert fast["ttft_s"]["p95"] == pytest.approx(0.09, rel=RELATIVE_ACCURACY)  # rank 8
    assert fast["output_tokens_per_s"]["p50"] == pytest.approx(50.0, rel=RELATIVE_ACCURACY)
    assert std["output_tokens_per_s"]["p50"] == pytest.approx(20.0, rel=RELATIVE_ACCURACY)
    assert fast["tokens"] == {"prompt": 10_000, "cached": 5000, "completion": 210,
                              "cached_share": 0.5}
    # 10 × (500 × $2 + 500 × $0.2 + 21 × $6) / 1e6 = $0.01226 in 10 s = $4.4136/h
    assert fast["cost_usd"] == pytest.approx(0.01226)
    assert fast["usd_per_hour"] == pytest.approx(0.01226 / 10 * 3600)
    assert doc["cost"]["usd"] == pytest.approx(fast["cost_usd"] + std["cost_usd"])
    # series: one point per 5 s step over the 60 s window, unix times, ending now
    series = fast["series"]
    assert len(series["t"]) == 12 and all(len(v) == 12 for v in series.values())
    assert series["t"][-1] <= wall.t and wall.t - series["t"][0] <= 60.0
    assert sum(series["requests"]) == 10 and series["ttft_p50_s"][0] is None
    assert m["auto"]["decisions"] == [{"tier": "fast", "reason": "fast-faster", "count": 10,
                                       "share": 1.0}]
    auto_series = m["auto"]["series"]
    assert sum(auto_series["decisions"]) == 10 and len(auto_series["t"]) == 12
    assert {v for v in auto_series["fast_share"] if v is not None} == {1.0}
    est = fast["auto_estimate"]
    assert set(est) >= {"ttft_s", "output_tokens_per_s", "load", "samples"}
    assert est["uncached_prompt_tokens"] == 500.0  # the window's mean: 1,000 − 500 cached
    sessions = doc["sessions"]
    assert sessions["active"] == 3
    assert sessions["most_active"][0]["session_id"] == "s-1"
    assert sessions["most_expensive"][0]["session_id"] == "s-1"  # fast prices, 10 turns
    assert sessions["most_active"][0]["key_id"] == "team-a"
    assert doc["incidents"]["totals"] == {"retry": 0, "fallback": 0, "timeout": 0}


def test_replica_states_and_the_sick_marker(world) -> None:
    w = world
    pools, src, mono, wall = w.pools, w.src, w.mono, w.wall
    std = pools.get("m", "standard")
    fast = pools.get("m", "fast")
    assert std is not None and fast is not None
    std.replicas[0].healthy = False
    fast.replicas[1].outlier.ejected_until = mono.t + 25.0
    fast.replicas[1].outlier.ejections_total = 1
    apply_engine_metrics(fast.replicas[0], {
        "vllm:num_requests_running": 3, "vllm:num_requests_waiting": 1,
        "vllm:kv_cache_usage_perc": 0.42, "vllm:prefix_cache_queries": 1000,
        "vllm:prefix_cache_hits": 750, "vllm:spec_decode_num_drafts": 100,
        "vllm:spec_decode_num_draft_tokens": 400, "vllm:spec_decode_num_accepted_tokens": 280,
    }, now=mono.t - 0.5)
    doc = console_snapshot(src)
    (m,) = doc["models"]
    s_pool, f_pool = m["pools"]
    assert (s_pool["tier"], s_pool["healthy"], s_pool["sick"], s_pool["usable"]) == (
        "standard", 1, 1, 1)
    bad = s_pool["replicas"][0]
    assert (bad["state"], bad["sick"], bad["healthy"]) == ("unhealthy", True, False)
    ej = f_pool["replicas"][1]
    assert (ej["state"], ej["sick"], ej["ejected"]) == ("ejected", True, True)
    assert ej["ejected_until"] == pytest.approx(wall.t + 25.0)  # unix s
    assert ej["ejected_for_s"] == pytest.approx(25.0)
    ok = f_pool["replicas"][0]
    assert ok["state"] == "ok" and not ok["sick"]
    e = ok["engine"]
    assert (e["running"], e["waiting"], e["kv_cache_usage"], e["fresh"]) == (3, 1, 0.42, True)
    assert e["prefix_cache_hit_rate"] == 0.75  # one scrape: since the engine started
    assert e["spec_acceptance_rate"] == 0.7 and e["spec_tokens_per_step"] == 3.8
    assert e["over_s"] is None
    never = s_pool["replicas"][1]["engine"]
    assert never["fresh"] is False and never["running"] is None
    assert doc["gateway"]["status"] == "ready"  # every model still has a healthy replica
    std.replicas[1].healthy = False
    fast.replicas[0].healthy = fast.replicas[1].healthy = False
    assert console_snapshot(src)["gateway"]["status"] == "not_ready"


def test_engine_rates_over_the_last_minute(world) -> None:
    w = world
    pools, src, mono = w.pools, w.src, w.mono
    r = pools.get("m", "fast").replicas[0]  # type: ignore[union-attr]

    def scrape(q: float, h: float) -> None:
        apply_engine_metrics(r, {"vllm:prefix_cache_queries": q, "vllm:prefix_cache_hits": h},
                             now=mono.t)

    scrape(10_000, 1_000)  # a cold start: 10 % overall
    console_snapshot(src)
    mono.t += 10
    scrape(20_000, 10_000)  # the last 10 s: 9,000 of 10,000 hit
    e = console_snapshot(src)["models"][0]["pools"][1]["replicas"][0]["engine"]
    assert e["prefix_cache_hit_rate"] == 0.9 and e["over_s"] == 10.0


def test_no_secret_in_the_document(world) -> None:
    w = world
    src = w.src
    text = json.dumps(console_snapshot(src))
    assert SECRET not in text and "admin:" not in text
    assert "10.0.0.1:8000" in text  # the address itself is shown


def test_window_override_narrows_the_summary_not_the_charts(world) -> None:
    w = world
    config, pools, rec, src, mono = w.config, w.pools, w.rec, w.src, w.mono
    rec.observe(_finished(config, pools, "fast", 0.1))
    mono.t += 30
    rec.observe(_finished(config, pools, "fast", 0.1))
    doc = console_snapshot(src, window_s=10)
    fast = doc["models"][0]["tiers"]["fast"]
    assert doc["window_s"] == 10.0 and fast["requests"] == 1
    assert sum(fast["series"]["requests"]) == 2 and len(fast["series"]["t"]) == 12
