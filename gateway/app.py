"""The FastAPI application: routes, lifespan (upstream client, health probes), request ids.

The hot-path routes, one per client API (``gateway.protocols``), are raw ASGI endpoints
(``handler.Endpoint``); the rest (models, health, metrics, usage, stored responses) are
ordinary FastAPI routes. No compression middleware: ``text/event-stream`` is never compressed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.admit.audit import client_addr
from gateway.admit.auth import PermissionDenied
from gateway.admit.connections import GUARD_KEY, ConnectionGuard
from gateway.admit.control import build_admission
from gateway.admit.flow.metrics import register_flow_metrics
from gateway.admit.gate import Gate
from gateway.admit.hardening import HeadersTooLarge, check_headers
from gateway.asgi import RequestIdMiddleware, Scope, request_id, send_error, send_response
from gateway.common.redis_conn import RedisConnection
from gateway.config import GatewayConfig, load_config
from gateway.console.recorder import ConsoleRecorder
from gateway.console.routes import install_console
from gateway.console.state import ConsoleSources
from gateway.errors import GatewayError
from gateway.handler import Endpoint
from gateway.plan.auto.service import AutoTier
from gateway.plan.tiers import ModelIndex
from gateway.protocols.errors import ANTHROPIC_ERRORS, OPENAI_ERRORS
from gateway.protocols.registry import (
    build_protocols,
    cancel_bus,
    longest_deadline_s,
    response_store,
)
from gateway.protocols.responses import ResponsesProtocol
from gateway.protocols.responses_routes import add_response_routes
from gateway.routing.pools import PoolRegistry
from gateway.routing.service import RoutingService
from gateway.state import GatewayState
from gateway.telemetry import tokencount
from gateway.telemetry.gcstats import GcSettings, GcStats
from gateway.telemetry.metrics import CONTENT_TYPE, GatewayMetrics
from gateway.telemetry.procstats import ProcessCollector
from gateway.telemetry.tracing import Telemetry
from gateway.telemetry.usage_store import (
    MemoryUsageStore,
    RedisUsageStore,
    UsageStore,
    UsageStoreUnavailable,
)
from gateway.upstream.client import Upstream
from gateway.upstream.discovery import DnsDiscovery
from gateway.upstream.health import HealthChecker


class SpeedgateApp:
    """The outermost ASGI app. ``POST`` to a protocol's path goes straight to its raw
    endpoint (no middleware layers on the per-token path); everything else, lifespan included,
    goes to the FastAPI app ``api``. A trailing slash names the same route (no redirects)."""

    def __init__(
        self, api: FastAPI, hot: dict[str, Endpoint], max_header_bytes: int = 32768
    ) -> None:
        self.api = api
        self.hot = hot
        self.max_header_bytes = max_header_bytes

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            try:
                check_headers(scope["headers"], self.max_header_bytes)
            except HeadersTooLarge as e:
                rid = request_id(scope)
                endpoint = self.hot.get(scope["path"])
                if endpoint is None:
                    await send_error(send, e, [(b"x-request-id", rid.encode())])
                    return
                shape = endpoint.protocol.errors
                await send_response(
                    send, shape.status(e), shape.body(e, rid),
                    [(b"x-request-id", rid.encode()), *shape.headers(e)],
                )
                return
            path = scope["path"]
            if len(path) > 1 and path.endswith("/"):
                # /v1/chat/completions/ is /v1/chat/completions: served, never redirected (a
                # redirect's Location would be built from the client's Host header)
                scope = {**scope, "path": path.rstrip("/") or "/"}
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = self.hot.get(scope["path"])
            if endpoint is not None:
                scope["speedgate.request_id"] = request_id(scope)
                await endpoint(scope, receive, send)
                return
        await self.api(scope, receive, send)


def _error(e: GatewayError) -> Response:
    return Response(e.to_bytes(), status_code=e.status, media_type="application/json",
                    headers=e.headers())


def _json(status: int, doc: Any) -> Response:
    return Response(orjson.dumps(doc), status_code=status, media_type="application/json")


def create_app(config: GatewayConfig) -> SpeedgateApp:
    """Build the gateway app for ``config``. The upstream client and the health probes start in
    the app's lifespan (inside the server's event loop) and stop with it."""
    pools = PoolRegistry(config)
    models = ModelIndex(config)
    metrics = GatewayMetrics(pools)
    holder: dict[str, GatewayState] = {}

    telemetry = Telemetry(config.telemetry, registry=metrics.registry)
    # one Redis client and one circuit breaker, shared by rate limits, routing and usage totals
    redis = RedisConnection.from_config(config.state)
    # API keys (read here: a bad keys_file fails at startup), rate limits
    gate = Gate(config, redis=redis)
    auto = AutoTier(config, pools)  # the auto tier's live estimates (issue 10)
    metrics.registry.register(auto.collector())
    console = ConsoleRecorder(config.console) if config.console.enabled else None  # issue 19
    # slow/idle client limits, read by each connection's protocol from the lifespan state
    guard = ConnectionGuard(config.server)
    metrics.registry.register(guard.collector())
    admission = build_admission(config, pools)  # bands, pool queues, session budgets (issue 17)
    register_flow_metrics(admission.flow, metrics.registry)
    metrics.registry.register(admission.budgets.collector())
    responses_store = response_store(config)  # Responses API state (issue 16)
    protocols = build_protocols(responses_store)
    responses = protocols["/v1/responses"]
    assert isinstance(responses, ResponsesProtocol)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        upstream = Upstream(config.upstream)
        health = HealthChecker(config.health, pools, upstream)
        usage: UsageStore = (
            RedisUsageStore(redis.client, breaker=redis.breaker)
            if redis is not None
            else MemoryUsageStore()
        )
        state = GatewayState(
            config, models, pools, upstream, health, metrics, telemetry, usage, admission
        )
        state.auto = auto
        state.console = console
        holder["state"] = state
        app.state.gateway = state
        for endpoint in hot.values():  # the hot path reads the state itself, not via _Lazy
            endpoint.state = state
        routing = RoutingService(config, pools, upstream, redis=redis)
        routing_collector = routing.register_metrics(metrics.registry)
        process_collector = ProcessCollector(asyncio.get_running_loop())
        metrics.registry.register(process_collector)
        gc_stats, gc_settings = GcStats(), GcSettings()
        metrics.registry.register(gc_stats)
        discoveries = []
        for pool in pools.all():
            d = pool.config.discovery
            if d is not None:
                disc = DnsDiscovery(
                    d.host, d.port, interval_s=d.interval_s, timeout_s=d.timeout_s,
                    scheme=d.scheme, family=d.family, on_change=pool.set_endpoints,
                )
                await disc.resolve_once()
                disc.start()
                discoveries.append(disc)
        bus = cancel_bus(config)  # cancels between gateway replicas (Redis)
        responses.state.attach(upstream, bus, longest_deadline_s(config))
        await tokencount.warm_up(config.telemetry.usage_estimate_encoding)
        await telemetry.start()
        health.start()
        routing.start()
        auto.start()
        gc_settings.settle()  # start-up heap frozen, thresholds set (telemetry.gcstats)
        gc_stats.install()  # collections counted from here on
        try:
            yield {GUARD_KEY: guard}  # the ASGI lifespan state: uvicorn hands it to protocols
        finally:
            gc_settings.restore()
            gc_stats.uninstall()
            metrics.registry.unregister(gc_stats)
            await auto.stop()
            await routing.stop()
            metrics.registry.unregister(routing_collector)
            metrics.registry.unregister(process_collector)
            for disc in discoveries:
                await disc.stop()
            await health.stop()
            await upstream.close()
            await telemetry.shutdown()
            await usage.close()
            await gate.close()
            if redis is not None:
                await redis.close()
            await admission.close()
            await responses_store.close()
            if bus is not None:
                await bus.stop()

    app = FastAPI(
        title="speedgate",
        summary="OpenAI-compatible inference gateway with speed tiers",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )

    class _Lazy:
        """Resolves the state created in the lifespan at request time."""

        def __getattr__(self, name: str) -> Any:
            return getattr(holder["state"], name)

    lazy: Any = _Lazy()
    hot: dict[str, Endpoint] = {}
    for path, protocol in protocols.items():
        hot[path] = Endpoint(lazy, protocol, gate)
        # also a FastAPI route, so other methods get a proper 405
        app.router.routes.append(Route(path, hot[path], methods=["POST"]))

    created = int(time.time())

    @app.get("/v1/models")
    async def list_models(request: Request) -> Response:
        try:
            gate.authenticate(request.scope)
        except GatewayError as e:
            return _error(e)
        return _json(200, {"object": "list", "data": [model_entry(n) for n in models.names()]})

    @app.get("/v1/models/{model_id:path}")
    async def retrieve_model(request: Request, model_id: str) -> Response:
        try:
            gate.authenticate(request.scope)
        except GatewayError as e:
            return _error(e)
        for entry in models.names():
            if entry[0] == model_id:
                return _json(200, model_entry(entry))
        return _error(GatewayError(f"The model `{model_id}` does not exist.", status=404,
                                   type="invalid_request_error", code="model_not_found",
                                   param="model"))

    def model_entry(entry: tuple[str, str, Any]) -> dict[str, Any]:
        name, model_name, tier = entry
        m = config.models[model_name]
        out: dict[str, Any] = {"id": name, "object": "model", "created": created,
                               "owned_by": "speedgate"}
        if tier is None:
            out["tiers"] = list(m.tiers)
            out["default_tier"] = m.default_tier
            out["aliases"] = dict(m.aliases)
        else:
            out["parent"] = model_name
            out["tier"] = tier
        return out

    add_response_routes(app, gate.authenticate, responses.state)

    @app.api_route("/healthz", methods=["GET", "HEAD"])
    async def healthz() -> Response:
        return _json(200, {"status": "ok"})

    @app.get("/readyz")
    async def readyz() -> Response:
        ready = True
        report: dict[str, Any] = {}
        now = time.monotonic()
        for name in config.models:
            tiers = {}
            for p in pools.all():
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
        # Redis down (seen by any of its users: one breaker): still ready (routing falls back
        # to consistent hashing, limits to local memory or 503), but degraded
        degraded = redis is not None and redis.degraded
        status = ("degraded" if degraded else "ready") if ready else "not_ready"
        return _json(200 if ready else 503, {"status": status, "degraded": degraded,
                                             "models": report})

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(await metrics.render_async(), media_type=CONTENT_TYPE)

    @app.get("/v1/usage")
    async def usage_totals(
        request: Request, session_id: str | None = None, key_id: str | None = None
    ) -> Response:
        """Totals of one session (``x-session-id``) or one API key id: requests, tokens by
        type, cost (USD), TTFT and e2e sums (seconds)."""
        caller = None
        try:
            caller = gate.authenticate(request.scope)
            if caller is not None and not caller.config.admin and (
                key_id != caller.id or session_id is not None
            ):
                raise PermissionDenied(
                    "Reading usage of other keys or of sessions needs an admin API key.",
                    code="admin_required",
                )
        except GatewayError as e:
            if isinstance(e, PermissionDenied):
                gate.audit.event("permission_denied", code=e.code, key_id=caller and caller.id,
                                 path="/v1/usage", client=client_addr(request.scope))
            return _error(e)
        if caller is not None and caller.config.admin:
            gate.audit.event("admin_action", level=logging.INFO, action="read_usage",
                             key_id=caller.id, target_key_id=key_id,
                             target_session=session_id is not None,
                             client=client_addr(request.scope))
        if session_id is None and key_id is None:
            err = GatewayError("give session_id (and, for its budget, key_id) or key_id",
                               status=400, type="invalid_request_error", param="session_id")
            return _error(err)
        store = holder["state"].usage
        try:
            totals = await (store.get_session(session_id) if session_id is not None
                            else store.get_key(key_id or ""))
        except UsageStoreUnavailable:
            return _error(GatewayError("usage store unavailable", status=503,
                                       code="state_unavailable", retry_after_s=5))
        scope: dict[str, Any] = (
            {"session_id": session_id} if session_id is not None else {"key_id": key_id}
        )
        if session_id is not None:  # its budget under key_id, else under the caller's key
            owner = key_id if key_id is not None else (caller.id if caller is not None else None)
            try:
                scope["budget"] = await admission.budgets.read(owner, session_id)
            except Exception:  # the budget store is down: the totals still answer
                scope["budget"] = None
        return _json(200, {"object": "usage", **scope, **totals.to_dict()})

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        """No route (404) or no such method (405), in the API's own shape: a path the gateway
        cannot serve is OpenAI's ``Invalid URL (METHOD /path)`` (Anthropic's
        ``not_found_error`` under ``/v1/messages``), so clients fall back."""
        status = exc.status_code
        path = request.url.path
        message = (f"Invalid URL ({request.method} {path})" if status == 404
                   else str(exc.detail))
        err = GatewayError(
            message,
            status=status,
            type="invalid_request_error" if status < 500 else "server_error",
            code={404: "not_found", 405: "method_not_allowed"}.get(status),
        )
        shape = ANTHROPIC_ERRORS if path.startswith("/v1/messages") else OPENAI_ERRORS
        headers = {k.decode(): v.decode() for k, v in shape.headers(err)}
        return Response(shape.body(err, request_id(request.scope)), status_code=status,
                        media_type="application/json", headers=headers | dict(exc.headers or {}))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        return _error(GatewayError(str(exc), status=400, type="invalid_request_error"))

    if console is not None:  # GET /console, /v1/console/state and the / redirect
        install_console(app, ConsoleSources(
            config, pools, console, auto,
            degraded=lambda: redis is not None and redis.degraded,
            auth_enabled=gate.enabled,
        ), gate)

    app.router.redirect_slashes = False  # no redirect to a client-supplied Host, ever
    app.add_middleware(RequestIdMiddleware)
    return SpeedgateApp(app, hot, config.server.max_header_bytes)


def create_app_from_env() -> SpeedgateApp:
    """App factory for ``uvicorn --factory`` and multi-worker serving: reads the config file
    named by ``SPEEDGATE_CONFIG``."""
    return create_app(load_config(os.environ.get("SPEEDGATE_CONFIG")))
