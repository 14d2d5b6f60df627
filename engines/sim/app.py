"""The aiohttp application: OpenAI endpoints, health, metrics, and the ``/sim`` control plane.

Endpoints (vLLM's paths and shapes): ``POST /v1/chat/completions``, ``POST /v1/completions``,
``POST /v1/responses`` (``GET /v1/responses/{id}`` and ``.../cancel``: 404, nothing is stored),
``POST /v1/messages``, ``POST /v1/messages/count_tokens``, ``GET /v1/models``, ``GET /health``
(200 empty; 503 during ``--slow-start-s``), ``GET /metrics``.
Test/inspection: ``GET /sim/requests`` (last 32 requests received), ``POST|DELETE /sim/faults``
(replica fault script), ``GET /sim/stats``, ``POST /sim/reset``.

Served by ``web.AppRunner(app, handler_cancellation=True)`` so a client disconnect cancels the
handler, streaming or not (see :func:`serve`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import zlib
from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web
from pydantic import ValidationError

from engines.procs import write_port_file
from engines.sim import protocol as P
from engines.sim.completions import (
    chat_completions,
    completions,
    count_tokens,
    error_response,
    messages,
    responses,
)
from engines.sim.config import SimConfig
from engines.sim.faults import NO_FAULTS, Faults
from engines.sim.metrics import CONTENT_TYPE
from engines.sim.replica_state import STATE, Counts, SimState
from engines.sim.textgen import render_chat
from engines.sim.textgen import tokenize as textgen_tokenize

READY_LINE = "SPEEDGATE_SIM_READY port={port}"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def crash_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Fault ``crash``: the process exits at once when the next (non-control) request arrives."""
    if request.app[STATE].faults.crash and not request.path.startswith("/sim/"):
        os._exit(1)
    return await handler(request)


def _json(data: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


async def response_not_stored(request: web.Request) -> web.Response:
    """``GET /v1/responses/{id}`` and ``POST /v1/responses/{id}/cancel``: vLLM 0.32 without
    ``VLLM_ENABLE_RESPONSES_API_STORE`` stores nothing, so every id is 404."""
    rid = request.match_info["response_id"]
    return error_response(request.app[STATE], None, 404, f"Response with id '{rid}' not found.",
                          param="response_id")


async def health(request: web.Request) -> web.Response:
    """``GET /health``: 200 with an empty body when ready, 503 while starting."""
    return web.Response(status=200 if request.app[STATE].ready else 503)


async def models(request: web.Request) -> web.Response:
    """``GET /v1/models``."""
    st = request.app[STATE]
    body = P.models_list(st.config.model, st.created, st.config.max_model_len)
    return web.Response(body=body, content_type="application/json")


async def tokenize(request: web.Request) -> web.Response:
    """``POST /tokenize`` (vLLM's, ``vllm/entrypoints/serve/tokenize``): ``{"prompt": str}``
    or ``{"messages": [...], "tools"?: [...]}`` (rendered as the chat endpoints render them,
    tools after the messages) -> ``{"count",
    "max_model_len", "tokens", "token_strs"}``, counted by the simulator's tokenizer
    (``textgen.tokenize``: the tokens its generated text is made of); ids are CRC32s of the
    token strings modulo 2**17. A ``model`` other than the served one is vLLM's 404."""
    st = request.app[STATE]
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError as e:
        return error_response(st, None, 400, f"Invalid JSON in request body: {e}")
    if not isinstance(body, dict):
        return error_response(st, None, 400, "Request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != st.config.model:
        return error_response(st, None, 404, f"The model `{model}` does not exist.",
                              param="model")
    if isinstance(body.get("prompt"), str):
        text = body["prompt"]
    elif isinstance(body.get("messages"), list):
        try:
            text = render_chat(body["messages"])
        except ValueError as e:
            return error_response(st, None, 400, str(e), param="messages")
    else:
        return error_response(st, None, 400, "'prompt' (a string) or 'messages' is required",
                              param="prompt")
    if isinstance(body.get("tools"), list) and body["tools"]:  # vLLM renders them in the
        text += orjson.dumps(body["tools"]).decode()  # chat template: they count
    tokens = textgen_tokenize(text)
    return _json({
        "count": len(tokens), "max_model_len": st.config.max_model_len,
        "tokens": [zlib.crc32(t.encode()) % 131072 for t in tokens],
        "token_strs": tokens if body.get("return_token_strs") else None,
    })


async def metrics(request: web.Request) -> web.Response:
    """``GET /metrics``: Prometheus text exposition."""
    st = request.app[STATE]
    data = st.metrics.render(st.engine.num_running, st.engine.num_waiting, st.cache.usage)
    return web.Response(body=data, headers={"Content-Type": CONTENT_TYPE})


async def sim_requests(request: web.Request) -> web.Response:
    """``GET /sim/requests``: the last 32 requests received, oldest first."""
    return _json(list(request.app[STATE].log))


async def sim_set_faults(request: web.Request) -> web.Response:
    """``POST /sim/faults``: replace this replica's fault script."""
    st = request.app[STATE]
    try:
        st.faults = Faults.model_validate_json(await request.read() or b"{}")
    except ValidationError as e:
        return error_response(st, None, 400, f"Invalid faults: {e}")
    return _json(st.faults.model_dump(exclude_unset=True))


async def sim_clear_faults(request: web.Request) -> web.Response:
    """``DELETE /sim/faults``: clear this replica's fault script."""
    request.app[STATE].faults = NO_FAULTS
    return _json({})


async def sim_get_faults(request: web.Request) -> web.Response:
    """``GET /sim/faults``: the replica's fault script (set fields only)."""
    return _json(request.app[STATE].faults.model_dump(exclude_unset=True))


async def sim_stats(request: web.Request) -> web.Response:
    """``GET /sim/stats``: request counters and the engine's running/waiting sequences."""
    st = request.app[STATE]
    c = st.counts
    return _json({
        "requests": c.requests, "aborted": c.aborted, "completed": c.completed,
        "running": st.engine.num_running, "waiting": st.engine.num_waiting,
        "kv_cache_usage": st.cache.usage, "prefix_cache_queries": st.cache.queries,
        "prefix_cache_hits": st.cache.hits,
    })


async def sim_reset(request: web.Request) -> web.Response:
    """``POST /sim/reset``: clear counters, the request log and the (unused) KV cache blocks."""
    st = request.app[STATE]
    st.counts = Counts()
    st.log.clear()
    st.cache.clear()
    return _json({})


def build_app(config: SimConfig) -> web.Application:
    """The simulator application for ``config`` (the engine loop starts with the app)."""
    app = web.Application(middlewares=[crash_middleware], client_max_size=1024**3)
    state = SimState.from_config(config)
    app[STATE] = state

    async def engine_ctx(_app: web.Application):
        state.engine.start()
        yield
        await state.engine.stop()

    app.cleanup_ctx.append(engine_ctx)
    r = app.router
    r.add_post("/v1/chat/completions", chat_completions)
    r.add_post("/v1/completions", completions)
    r.add_post("/v1/responses", responses)
    r.add_get("/v1/responses/{response_id}", response_not_stored)
    r.add_post("/v1/responses/{response_id}/cancel", response_not_stored)
    r.add_post("/v1/messages", messages)
    r.add_post("/v1/messages/count_tokens", count_tokens)
    r.add_get("/v1/models", models)
    r.add_get("/health", health)
    r.add_post("/tokenize", tokenize)
    r.add_get("/metrics", metrics)
    r.add_get("/sim/requests", sim_requests)
    r.add_get("/sim/faults", sim_get_faults)
    r.add_post("/sim/faults", sim_set_faults)
    r.add_delete("/sim/faults", sim_clear_faults)
    r.add_get("/sim/stats", sim_stats)
    r.add_post("/sim/reset", sim_reset)
    return app


DRAIN_TIMEOUT_S = 5.0  # seconds in-flight requests get to finish after SIGTERM


async def serve(config: SimConfig, stop: asyncio.Event | None = None) -> None:
    """Serve ``config`` until ``stop`` is set (or forever); prints the ready line with the port."""
    app = build_app(config)
    # SIGTERM drains like a uvicorn-based vLLM server: stop accepting, let in-flight requests
    # finish (bounded by shutdown_timeout), then exit. SIGKILL is the abrupt crash.
    runner = web.AppRunner(
        app, handler_cancellation=True, access_log=None, shutdown_timeout=DRAIN_TIMEOUT_S
    )
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port, backlog=4096)
    await site.start()
    port = config.port
    for addr in runner.addresses:
        if isinstance(addr, tuple):
            port = addr[1]
            break
    if config.port_file:
        write_port_file(config.port_file, port)
    print(READY_LINE.format(port=port), flush=True)
    stop = stop or asyncio.Event()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        await stop.wait()
    finally:
        with contextlib.suppress(Exception):
            await runner.cleanup()


def run(config: SimConfig) -> None:
    """Run :func:`serve` on uvloop when available."""
    try:
        import uvloop
    except ImportError:
        uvloop = None  # type: ignore[assignment]
    with contextlib.suppress(KeyboardInterrupt):
        if uvloop is not None and sys.platform != "win32":
            uvloop.run(serve(config))
        else:
            asyncio.run(serve(config))
