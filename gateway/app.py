"""The application: the outermost ASGI app, the lifespan, and ``create_app`` wiring the parts.

The hot-path routes, one per client API (``gateway.protocols``), are raw ASGI apps
(``handler.ApiRoute``); the rest (models, health, metrics, usage, stored responses, the console)
are ordinary FastAPI routes, each in its own module (``gateway.routes``,
``protocols.responses.routes``, ``console.routes``). The state is built once, finished, before
the server's loop runs (``gateway.state.build_state``); the lifespan starts and stops what it
holds. No compression middleware: ``text/event-stream`` is never compressed.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from fastapi import FastAPI
from starlette.routing import Route

from gateway.admit.connections import GUARD_KEY, ConnectionGuard
from gateway.admit.gate import Gate
from gateway.admit.hardening import HeadersTooLarge, check_headers
from gateway.asgi import RequestIdMiddleware, Scope, request_id, send_error, send_response
from gateway.common.redis_conn import RedisConnection
from gateway.config import GatewayConfig, load_config
from gateway.console.routes import install_console
from gateway.console.snapshot import ConsoleSources
from gateway.handler import ApiRoute
from gateway.protocols.registry import (
    build_protocols,
    cancel_bus,
    longest_deadline_s,
    response_store,
)
from gateway.protocols.responses.protocol import ResponsesProtocol
from gateway.protocols.responses.routes import add_response_routes
from gateway.protocols.responses.store import ResponseStore
from gateway.routes.json_answers import install_error_handlers
from gateway.routes.models import add_model_routes
from gateway.routes.ops import add_ops_routes
from gateway.routes.usage_totals import add_usage_route
from gateway.routing.service import RoutingService
from gateway.state import GatewayState, build_state
from gateway.telemetry import tokencount
from gateway.telemetry.gcstats import GcSettings, GcStats
from gateway.telemetry.procstats import ProcessCollector
from gateway.upstream.discovery import start_discoveries
from gateway.upstream.load_scraper import LoadScraper


class SpeedgateApp:
    """The outermost ASGI app. ``POST`` to a protocol's path goes straight to its raw
    ``ApiRoute`` (no middleware layers on the per-token path); everything else, lifespan included,
    goes to the FastAPI app ``api``. A trailing slash names the same route (no redirects)."""

    def __init__(
        self, api: FastAPI, hot: dict[str, ApiRoute], max_header_bytes: int = 32768
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
                route = self.hot.get(scope["path"])
                if route is None:
                    await send_error(send, e, [(b"x-request-id", rid.encode())])
                    return
                shape = route.protocol.errors
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
            route = self.hot.get(scope["path"])
            if route is not None:
                scope["speedgate.request_id"] = request_id(scope)
                await route(scope, receive, send)
                return
        await self.api(scope, receive, send)



def _lifespan(
    state: GatewayState, redis: RedisConnection | None, gate: Gate, guard: ConnectionGuard,
    responses: ResponsesProtocol, responses_store: ResponseStore,
) -> Any:
    """The lifespan of ``state``: everything that needs the server's loop (the upstream session,
    probes, discovery, the load scraper, routing's Redis watcher, the auto tier, telemetry
    export, the cancel bus) starts here and stops, in reverse, at shutdown; when a start fails,
    what had started stops before the error propagates (an ``AsyncExitStack``)."""
    config, pools, metrics = state.config, state.pools, state.metrics

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        upstream, health, auto, telemetry = (state.upstream, state.health, state.auto,
                                             state.telemetry)
        # each start is followed at once by its stop on the stack: at shutdown, or when a later
        # start fails, what did start stops, in reverse order (one stop failing skips none)
        async with AsyncExitStack() as stack:
            # what create_app built, closed last whatever happens below
            stack.push_async_callback(responses_store.close)
            stack.push_async_callback(state.admission.close)
            if redis is not None:
                stack.push_async_callback(redis.close)
            stack.push_async_callback(gate.close)
            stack.push_async_callback(state.usage.close)
            upstream.open()
            stack.push_async_callback(upstream.close)
            routing = RoutingService(config, pools, redis=redis)
            scraper = LoadScraper(pools, upstream)  # engine load, read by routing and auto tier
            routing_collector = routing.register_metrics(metrics.registry)
            stack.callback(metrics.registry.unregister, routing_collector)
            process_collector = ProcessCollector(asyncio.get_running_loop())
            metrics.registry.register(process_collector)
            stack.callback(metrics.registry.unregister, process_collector)
            gc_stats, gc_settings = GcStats(), GcSettings()
            metrics.registry.register(gc_stats)
            stack.callback(metrics.registry.unregister, gc_stats)
            for disc in await start_discoveries(pools):
                stack.push_async_callback(disc.stop)
            bus = cancel_bus(config)  # cancels between gateway replicas (Redis)
            if bus is not None:
                stack.push_async_callback(bus.stop)
            responses.state.attach(upstream, bus, longest_deadline_s(config))
            await tokencount.warm_up(config.telemetry.usage_estimate_encoding)
            tokencount.configure_cache(config.telemetry.token_count_cache_entries,
                                       config.telemetry.token_count_block_chars)
            await telemetry.start()
            stack.push_async_callback(telemetry.shutdown)
            for component in (health, routing, scraper, auto):
                component.start()
                stack.push_async_callback(component.stop)
            sweeper = asyncio.get_running_loop().create_task(state.sessions.run())  # idle ends
            stack.push_async_callback(_cancelled, sweeper)
            gc_settings.settle()  # start-up heap frozen, thresholds set (telemetry.gcstats)
            stack.callback(gc_settings.restore)
            gc_stats.install()  # collections counted from here on
            stack.callback(gc_stats.uninstall)
            yield {GUARD_KEY: guard}  # the ASGI lifespan state: uvicorn hands it to protocols

    return lifespan


async def _cancelled(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait for it to end (its exception, if any, swallowed)."""
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def create_app(config: GatewayConfig) -> SpeedgateApp:
    """Build the gateway app for ``config``: the finished state, the hot client-API routes, the
    ordinary routes and the lifespan that starts and stops the state's tasks."""
    # one Redis client and one circuit breaker, shared by rate limits, routing and usage totals
    redis = RedisConnection.from_config(config.state)
    state = build_state(config, redis)
    # API keys (read here: a bad keys_file fails at startup), rate limits
    gate = Gate(config, redis=redis)
    # slow/idle client limits, read by each connection's protocol from the lifespan state
    guard = ConnectionGuard(config.server)
    state.metrics.registry.register(guard.collector())
    responses_store = response_store(config)  # Responses API state
    protocols = build_protocols(responses_store)
    responses = protocols["/v1/responses"]
    assert isinstance(responses, ResponsesProtocol)

    app = FastAPI(
        title="speedgate",
        summary="OpenAI-compatible inference gateway with speed tiers",
        lifespan=_lifespan(state, redis, gate, guard, responses, responses_store),
        docs_url=None,
        redoc_url=None,
    )
    app.state.gateway = state
    hot = {path: ApiRoute(state, protocol, gate) for path, protocol in protocols.items()}
    for path, route in hot.items():  # also a FastAPI route, so other methods get a proper 405
        app.router.routes.append(Route(path, route, methods=["POST"]))

    def degraded() -> bool:
        return redis is not None and redis.degraded

    add_model_routes(app, config, state.models, gate.authenticate, state.pools)
    add_response_routes(app, gate.authenticate, responses.state)
    add_ops_routes(app, state, degraded)
    add_usage_route(app, state, gate)
    install_error_handlers(app)
    if state.console is not None:  # GET /console, /v1/console/state and the / redirect
        install_console(app, ConsoleSources(
            config, state.pools, state.console, state.auto,
            degraded=degraded, auth_enabled=gate.enabled,
        ), gate)

    app.router.redirect_slashes = False  # no redirect to a client-supplied Host, ever
    app.add_middleware(RequestIdMiddleware)
    return SpeedgateApp(app, hot, config.server.max_header_bytes)


def create_app_from_env() -> SpeedgateApp:
    """App factory for ``uvicorn --factory`` and multi-worker serving: reads the config file
    named by ``SPEEDGATE_CONFIG``."""
    return create_app(load_config(os.environ.get("SPEEDGATE_CONFIG")))
