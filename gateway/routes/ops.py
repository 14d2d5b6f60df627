"""Operations routes: ``/healthz`` (the process answers), ``/readyz`` (every model has a healthy
replica; per pool: replicas, healthy, ejected, usable) and ``/metrics`` (Prometheus text)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from starlette.responses import Response

from gateway.routes.json_answers import json_response
from gateway.state import GatewayState
from gateway.telemetry.metrics import CONTENT_TYPE


def readiness(state: GatewayState, degraded: bool) -> tuple[int, dict[str, Any]]:
    """``/readyz``'s status and body: 200 ``ready`` (or ``degraded`` while Redis is down: routing
    falls back to consistent hashing, limits to local memory or 503) when every model has a
    healthy replica in some tier, else 503 ``not_ready``."""
    ready = True
    report: dict[str, Any] = {}
    now = time.monotonic()
    for name in state.config.models:
        tiers = {}
        for p in state.pools.all():
            if p.model == name:
                tiers[p.tier] = {
                    "replicas": len(p.replicas),
                    "healthy": sum(r.healthy for r in p.replicas),
                    "ejected": sum(r.outlier.is_ejected(now) for r in p.replicas),
                    "usable": len(p.usable(now)),
                }
        report[name] = tiers
        if not any(t["healthy"] for t in tiers.values()):
            ready = False
    status = ("degraded" if degraded else "ready") if ready else "not_ready"
    return (200 if ready else 503), {"status": status, "degraded": degraded, "models": report}


def add_ops_routes(app: FastAPI, state: GatewayState, degraded: Callable[[], bool]) -> None:
    """Add ``/healthz``, ``/readyz`` and ``/metrics``; ``degraded()`` is True while the shared
    Redis is unreachable (seen by any of its users: one breaker)."""

    @app.api_route("/healthz", methods=["GET", "HEAD"])
    async def healthz() -> Response:
        return json_response(200, {"status": "ok"})

    @app.get("/readyz")
    async def readyz() -> Response:
        return json_response(*readiness(state, degraded()))

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(await state.metrics.render_async(), media_type=CONTENT_TYPE)
