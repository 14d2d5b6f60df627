"""The JSON document of ``GET /v1/console/state``: what the pools, tiers and sessions are doing
now. Built on demand from the live objects (``console_snapshot``); nothing here runs per request.

Units: seconds (``*_s``), unix seconds for points in time (``generated_at``, ``t``,
``ejected_until``, ``first_seen``…), tokens, USD (``*_usd``, ``usd_per_hour``), shares and rates
in 0..1. Figures over "the window" cover the last ``window_s`` seconds (``covered_s`` says how
much of it the process has been up for); chart series have one point per ``step_s`` bucket.
Never in it: prompt or completion text, API keys, URL credentials (replica URLs are redacted).

- ``object`` (``console.state``), ``version``, ``generated_at``, ``window_s``, ``step_s``,
  ``covered_s``, ``refresh_s`` (the page's poll period);
- ``gateway``: ``status`` (``ready`` / ``degraded`` / ``not_ready``, as ``/readyz``),
  ``auth_enabled``, ``pid``, ``uptime_s``, ``requests`` in the window by class (``ok``,
  ``error``, ``client_error``, ``disconnect``), ``requests_observed`` since start;
- ``models[]``: ``name``, ``default_tier``, ``aliases``, ``fallback``;
  ``pools[]`` (``key``, ``tier``, ``replicas_total``, ``healthy``, ``ejected``, ``usable``,
  ``sick``, ``inflight``, ``load_per_replica``, ``replicas[]``: ``name``, ``url``, ``state``
  (``ok``, ``unhealthy``, ``ejected``, ``saturated``, ``probation``, ``failing``), ``sick``,
  ``healthy``, ``probe_failures``, ``ejected``, ``ejected_until``, ``ejected_for_s``,
  ``ejections_total``, ``consecutive_failures``, ``probation``, ``inflight``, ``load``,
  ``engine``: ``running``, ``waiting``, ``kv_cache_usage`` (None unless scraped lately),
  ``scraped_age_s``, ``fresh``, ``kv_tokens``, ``kv_block_size``, ``kv_free_tokens``,
  ``kv_headroom_tokens`` (free less this gateway's open requests' prompt + output caps, as
  routing sees it: ``routing.fit.free_kv_tokens``; None until the capacity is known),
  ``max_model_len``, ``preemptions`` (KV capacity; 0 until learned), ``prefix_cache_hit_rate``,
  ``spec_acceptance_rate``, ``spec_tokens_per_step``, ``over_s`` (``gateway.console.engine``));
  ``tiers.<tier>``: ``requests``, ``ok``, ``errors``, ``client_errors``, ``disconnects``,
  ``error_rate``, ``requests_per_s``, ``ttft_s`` {``p50``, ``p95``, ``mean``, ``n``},
  ``output_tokens_per_s`` {``p50``, ``p5``, ``mean``, ``n``}, ``tokens`` {``prompt``,
  ``cached``, ``completion``, ``cached_share``}, ``cost_usd``, ``usd_per_hour``,
  ``auto_estimate`` (the auto tier's model at the current load: ``ttft_s`` for the window's
  mean ``uncached_prompt_tokens``, ``output_tokens_per_s``, ``load``, ``samples``, ``age_s``,
  its decayed measurements), and
  ``series`` (per step: ``t``, ``ttft_p50_s``, ``ttft_p95_s``, ``output_tokens_per_s_p50``,
  ``requests``, ``errors``, ``cost_usd``); ``auto``: ``decisions`` in the window (``tier``,
  ``reason``, ``count``, ``share``), ``decisions_total``, ``decisions_since_start``,
  ``series`` (per step: ``t``, ``decisions``, ``fast_share``);
- ``sessions``: ``active``, ``tracked``, ``evicted``, ``half_life_s``, ``most_active[]`` and
  ``most_expensive[]``, ``largest[]`` (by ``last_tokens``, the KV footprint of the latest turn)
  (``SessionStats.to_dict``: with ``parent_session_id`` and ``ended``), ``trees[]`` (sessions
  with subagents, each with ``children`` and the subtree's ``total``), ``ended[]`` (sessions
  that ended in the window, ``explicit`` or ``idle``), ``kv`` since start: ``refused`` (fits
  no replica), ``tier_dropped`` (served by a later tier for not fitting), ``move``, ``wait``
  (``routing.kv_placement``);
- ``cost``: ``per_pool`` {``usd``, ``usd_per_hour``}, ``usd``, ``usd_per_hour``;
- ``incidents``: ``totals`` by kind, ``by_reason[]`` (``kind``, ``where``, ``reason``,
  ``count``), ``recent[]`` (newest first: ``t``, ``age_s``, ``request_id``, ``model``,
  ``asked_tier``, ``served_tier``, ``status``, ``outcome``, ``key_id``, ``session_id``,
  ``incidents``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.config import GatewayConfig
from gateway.console.engine import EngineRates
from gateway.console.recorder import ConsoleRecorder
from gateway.console.sessions import recently_ended, session_trees, top_sessions
from gateway.console.window import PoolStep
from gateway.fleet.pools import Pool, PoolRegistry, Replica, replica_load
from gateway.plan.auto.service import AutoTier, pool_load
from gateway.routing.fit import free_kv_tokens

VERSION = 1
#: Engine load older than this many scrape intervals is stale (``gateway.upstream.load_scraper``).
STALE_SCRAPES = 3


@dataclass(slots=True)
class ConsoleSources:
    """The live objects the state is read from, and the clocks (monotonic and unix seconds;
    injected in tests)."""

    config: GatewayConfig
    pools: PoolRegistry
    recorder: ConsoleRecorder
    auto: AutoTier | None = None
    engine: EngineRates = field(default_factory=EngineRates)
    degraded: Callable[[], bool] = lambda: False
    auth_enabled: bool = False
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time


def _r(x: float | None, digits: int = 6) -> float | None:
    return None if x is None else round(x, digits)


def console_snapshot(src: ConsoleSources, window_s: float | None = None) -> dict[str, Any]:
    """The console document. ``window_s`` (optional) narrows the summary figures to the last
    ``window_s`` seconds (rounded to whole steps, at most the configured window); charts always
    span the whole window."""
    now, wall = src.clock(), src.wall()
    rec = src.recorder
    steps = rec.steps_for(window_s)
    covered = rec.covered_s(now, steps)
    src.engine.sample(src.pools.replicas())
    models = [_model(src, name, now, wall, steps, covered) for name in src.config.models]
    ready = all(any(p["healthy"] for p in m["pools"]) for m in models)
    outcomes = rec.outcome_counts(now, steps)
    return {
        "object": "console.state",
        "version": VERSION,
        "generated_at": wall,
        "window_s": steps * rec.step_s,
        "step_s": rec.step_s,
        "covered_s": _r(covered, 3),
        "refresh_s": rec.config.refresh_s,
        "gateway": {
            "status": ("degraded" if src.degraded() else "ready") if ready else "not_ready",
            "auth_enabled": src.auth_enabled,
            "pid": os.getpid(),
            "uptime_s": _r(now - rec.started, 3),
            "requests": {k: outcomes.get(k, 0) for k in ("ok", "error", "client_error",
                                                         "disconnect")},
            "requests_observed": rec.observed,
        },
        "models": models,
        "sessions": _sessions(src, now, wall),
        "cost": _cost(models),
        "incidents": _incidents(rec, now, wall, steps),
    }


# -- pools and replicas ---------------------------------------------------------------------
def _replica(src: ConsoleSources, pool: Pool, r: Replica, now: float, wall: float) -> dict:
    o = r.outlier
    ejected = o.is_ejected(now)
    cap = pool.config.max_inflight_per_replica
    interval = pool.config.routing.load_scrape_interval_s
    age = now - r.engine_load_at if r.engine_load_at else None
    fresh = age is not None and interval > 0 and age <= STALE_SCRAPES * max(interval, 1.0)
    if not r.healthy:
        state = "unhealthy"
    elif ejected:
        state = "ejected"
    elif cap and r.inflight >= cap:
        state = "saturated"
    elif o.probation:
        state = "probation"
    elif o.consecutive_failures:
        state = "failing"
    else:
        state = "ok"
    return {
        "name": r.name,
        "url": r.safe_url,
        "state": state,
        "sick": state in ("unhealthy", "ejected"),
        "healthy": r.healthy,
        "probe_failures": r.consecutive_probe_failures,
        "ejected": ejected,
        "ejected_until": wall + (o.ejected_until - now) if ejected else None,
        "ejected_for_s": _r(o.ejected_until - now, 3) if ejected else None,
        "ejections_total": o.ejections_total,
        "consecutive_failures": o.consecutive_failures,
        "probation": o.probation,
        "inflight": r.inflight,
        "load": replica_load(r, now),
        "engine": {
            "running": r.engine_running if fresh else None,
            "waiting": r.engine_waiting if fresh else None,
            "kv_cache_usage": _r(r.kv_cache_usage, 4) if fresh else None,
            # capacity the engine reported (0 = not learned yet): vllm:cache_config_info,
            # vllm:num_preemptions (cumulative) and /v1/models max_model_len
            "kv_tokens": r.kv_tokens,
            "kv_block_size": r.kv_block_size,
            "kv_free_tokens": round(r.kv_tokens * (1 - r.kv_cache_usage)) if fresh else None,
            # what routing sees free: less this gateway's open requests' prompt + output caps
            "kv_headroom_tokens": free_kv_tokens(r, now),
            "max_model_len": r.max_model_len,
            "preemptions": r.engine_preemptions,
            "scraped_age_s": _r(age, 3),
            "fresh": fresh,
            **{k: _r(v, 4) for k, v in src.engine.rates(r).items()},
        },
    }


def _pool(src: ConsoleSources, pool: Pool, now: float, wall: float) -> dict[str, Any]:
    replicas = [_replica(src, pool, r, now, wall) for r in list(pool.replicas)]
    return {
        "key": pool.key,
        "tier": pool.tier,
        "replicas_total": len(replicas),
        "healthy": sum(r["healthy"] for r in replicas),
        "ejected": sum(r["ejected"] for r in replicas),
        "usable": len(pool.usable(now)),
        "sick": sum(r["sick"] for r in replicas),
        "inflight": sum(r["inflight"] for r in replicas),
        "load_per_replica": _r(pool_load(pool, now), 3),
        "replicas": replicas,
    }


# -- tiers ------------------------------------------------------------------------------------
def _summary(w: PoolStep, covered: float) -> dict[str, Any]:
    done = w.requests - w.disconnects
    return {
        "requests": w.requests,
        "ok": w.ok,
        "errors": w.errors,
        "client_errors": w.client_errors,
        "disconnects": w.disconnects,
        "error_rate": _r(w.errors / done, 4) if done else None,
        "requests_per_s": _r(w.requests / covered, 4),
        "ttft_s": {"p50": _r(w.ttft.quantile(0.5)), "p95": _r(w.ttft.quantile(0.95)),
                   "mean": _r(w.ttft.mean()), "n": w.ttft.count},
        "output_tokens_per_s": {"p50": _r(w.tps.quantile(0.5), 3),
                                "p5": _r(w.tps.quantile(0.05), 3),
                                "mean": _r(w.tps.mean(), 3), "n": w.tps.count},
        "tokens": {"prompt": w.prompt_tokens, "cached": w.cached_tokens,
                   "completion": w.completion_tokens,
                   "cached_share": _r(w.cached_tokens / w.prompt_tokens, 4)
                   if w.prompt_tokens else None},
        "cost_usd": _r(w.cost_usd, 9),
        "usd_per_hour": _r(w.cost_usd / covered * 3600, 9),
    }


def _estimate(src: ConsoleSources, pool: Pool, now: float, w: PoolStep) -> dict[str, Any] | None:
    """The auto tier's model of ``pool`` now: TTFT at the current load for the window's mean
    uncached prompt (so it compares with the measured TTFT of the same requests), output
    tokens/s at the current load, and the estimator's own decayed measurements."""
    est = src.auto.estimators.get(pool.key) if src.auto is not None else None
    if est is None:
        return None
    snap = est.snapshot(now)
    load = pool_load(pool, now)
    uncached = (w.prompt_tokens - w.cached_tokens) / w.with_usage if w.with_usage else 0.0
    return {
        "load": _r(load, 3),
        "uncached_prompt_tokens": _r(uncached, 1),
        "ttft_s": _r(snap.ttft_s(load, uncached)),
        "output_tokens_per_s": _r(1.0 / snap.tpot_s(load), 3),
        "prefill_s_per_token": _r(snap.prefill_s_per_token, 9),
        "samples": snap.samples,
        "age_s": None if snap.age_s == float("inf") else _r(snap.age_s, 3),
        "measured_ttft_s": _r(est.measured_ttft.value),
        "measured_output_tokens_per_s": _r(est.measured_tps.value, 3),
        "spec_tokens_per_step": _r(est.tokens_per_step, 4),
    }


def _series(rec: ConsoleRecorder, key: str, now: float, wall: float) -> dict[str, list]:
    out: dict[str, list] = {k: [] for k in ("t", "ttft_p50_s", "ttft_p95_s",
                                            "output_tokens_per_s_p50", "requests", "errors",
                                            "cost_usd")}
    for epoch, b in rec.pool_series(key, now):
        out["t"].append(round(wall - (now - epoch * rec.step_s), 3))
        out["ttft_p50_s"].append(_r(b.ttft.quantile(0.5)) if b else None)
        out["ttft_p95_s"].append(_r(b.ttft.quantile(0.95)) if b else None)
        out["output_tokens_per_s_p50"].append(_r(b.tps.quantile(0.5), 3) if b else None)
        out["requests"].append(b.requests if b else 0)
        out["errors"].append(b.errors if b else 0)
        out["cost_usd"].append(_r(b.cost_usd, 9) if b else 0.0)
    return out


def _model(src: ConsoleSources, name: str, now: float, wall: float, steps: int,
           covered: float) -> dict[str, Any]:
    m = src.config.models[name]
    pools = [p for p in src.pools.all() if p.model == name]
    rec = src.recorder
    tiers = {}
    for p in pools:
        w = rec.pool_window(p.key, now, steps)
        tiers[p.tier] = {
            **_summary(w, covered),
            "auto_estimate": _estimate(src, p, now, w),
            "series": _series(rec, p.key, now, wall),
        }
    window = rec.auto_reasons(name, now, steps)
    total_w = sum(window.values())
    decisions = [
        {"tier": k.split(":", 1)[0], "reason": k.split(":", 1)[1], "count": n,
         "share": _r(n / total_w, 4)}
        for k, n in window.most_common()
    ]
    since_start = []
    if src.auto is not None:
        rows = [(t, r, n) for (mm, t, r), n in src.auto.decisions.items() if mm == name]
        total = sum(n for _, _, n in rows)
        since_start = [{"tier": t, "reason": r, "count": n, "share": _r(n / total, 4)}
                       for t, r, n in sorted(rows, key=lambda x: -x[2])]
    return {
        "name": name,
        "default_tier": m.default_tier,
        "aliases": dict(m.aliases),
        "fallback": dict(m.fallback),
        "pools": [_pool(src, p, now, wall) for p in pools],
        "tiers": tiers,
        "auto": {"decisions": decisions, "decisions_total": total_w,
                 "decisions_since_start": since_start,
                 "series": _auto_series(rec, name, now, wall)},
    }


def _auto_series(rec: ConsoleRecorder, model: str, now: float, wall: float) -> dict[str, list]:
    """Per step: auto decisions and the share of them served by the fast pool (0..1)."""
    out: dict[str, list] = {"t": [], "decisions": [], "fast_share": []}
    for epoch, b in rec.auto_series(model, now):
        n = sum(b.values()) if b else 0
        fast = sum(v for k, v in b.items() if k.startswith("fast:")) if b else 0
        out["t"].append(round(wall - (now - epoch * rec.step_s), 3))
        out["decisions"].append(n)
        out["fast_share"].append(_r(fast / n, 4) if n else None)
    return out


# -- sessions, cost, incidents ----------------------------------------------------------------
def _sessions(src: ConsoleSources, now: float, wall: float) -> dict[str, Any]:
    rec = src.recorder
    table = rec.sessions
    n = rec.config.top_sessions
    active = table.active(now, rec.window_s)
    return {
        "active": len(active),
        "tracked": len(table),
        "evicted": table.evicted,
        "half_life_s": table.half_life_s,
        "most_active": [s.to_dict(now, wall, table.half_life_s)
                        for s in top_sessions(active, n, "requests_per_min")],
        "most_expensive": [s.to_dict(now, wall, table.half_life_s)
                           for s in top_sessions(active, n, "usd_per_hour")],
        "largest": [s.to_dict(now, wall, table.half_life_s)
                    for s in top_sessions(active, n, "last_tokens") if s.last_tokens],
        "trees": session_trees(active, n, now, wall, table.half_life_s),
        "ended": recently_ended(active, n, now, wall, table.half_life_s),
        "kv": {k: rec.kv.get(k, 0) for k in ("refused", "tier_dropped", "move", "wait")},
    }


def _cost(models: list[dict[str, Any]]) -> dict[str, Any]:
    per_pool = {
        f"{m['name']}/{tier}": {"usd": t["cost_usd"], "usd_per_hour": t["usd_per_hour"]}
        for m in models for tier, t in m["tiers"].items()
    }
    return {
        "per_pool": per_pool,
        "usd": _r(sum(v["usd"] or 0.0 for v in per_pool.values()), 9),
        "usd_per_hour": _r(sum(v["usd_per_hour"] or 0.0 for v in per_pool.values()), 9),
    }


def _incidents(rec: ConsoleRecorder, now: float, wall: float, steps: int) -> dict[str, Any]:
    counts = rec.incident_counts(now, steps)
    horizon = now - steps * rec.step_s
    recent = [
        {
            "t": round(wall - (now - row.t), 3),
            "age_s": _r(now - row.t, 3),
            "request_id": row.request_id,
            "model": row.model,
            "asked_tier": row.asked_tier,
            "served_tier": row.served_tier,
            "status": row.status,
            "outcome": row.outcome,
            "key_id": row.key_id,
            "session_id": row.session_id,
            "incidents": [{"kind": i.kind, "where": i.where, "reason": i.reason}
                          for i in row.incidents],
        }
        for row in reversed(rec.recent) if row.t > horizon
    ]
    totals = {k: 0 for k in ("retry", "fallback", "timeout")}
    for (kind, _, _), n in counts.items():
        totals[kind] = totals.get(kind, 0) + n
    return {
        "totals": totals,
        "by_reason": [{"kind": k, "where": w, "reason": r, "count": n}
                      for (k, w, r), n in counts.most_common()],
        "recent": recent,
    }
