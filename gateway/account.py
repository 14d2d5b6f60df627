"""Step 5 of a request, account: usage (estimated with tiktoken when the engine sent none),
cost, metrics, the request span, the access log line and the per-key/per-session totals
(a subagent's linked to its parent's); then its session's end (``gateway.admit.session_end``:
asked for by the request, or others' for idleness).

Runs once per request on every exit path, after the response ended (or failed).
"""

from __future__ import annotations

import asyncio
import logging
import time

from gateway.common.usage import add_usage
from gateway.fleet.rates import PoolRates
from gateway.routing.keys import CONVERSATION, RESPONSES_CHAIN, session_key
from gateway.state import GatewayState
from gateway.telemetry.access_log import log_access
from gateway.telemetry.cost import USD_DECIMALS, cost_usd
from gateway.telemetry.record import RequestRecord
from gateway.telemetry.tokencount import estimate_usage
from gateway.telemetry.usage_store import UsageDelta
from gateway.upstream.exchange import Exchange

log = logging.getLogger("speedgate.accounting")


async def account(state: GatewayState, ex: Exchange) -> None:
    """Finish ``ex.rec`` and record it everywhere (``state``: the gateway's, for the stores,
    the auto tier and the console). When the engine reported no usage, it is estimated from
    the request's chat-shaped conversation (``ex.parsed``; none when it never parsed), counted
    with ``ex.protocol``'s rule, and the output: the stream payloads sent (``ex.relayed``) or
    the JSON response (``ex.response_doc``). What attempts that failed before the answer consumed
(``rec.spent``, ``rec.spent_cost_usd``: the engines' own reports) is added to the usage and
cost, also of a request that was never answered. Whether the response had started
    (``ex.started``) is recorded as ``rec.response_started``. Never raises (a failure here is
    logged, the request is already answered)."""
    rec, trace, protocol, relayed = ex.rec, ex.trace, ex.protocol, ex.relayed
    doc = ex.parsed.conversation if ex.parsed is not None else None
    rec.e2e_s = time.monotonic() - rec.t_start
    rec.response_started = ex.started
    try:
        if rec.served_tier and rec.usage is None and doc is not None and protocol.generates:
            output = (
                protocol.output_text(relayed)
                if rec.stream
                else protocol.json_output_text(ex.response_doc or {})
            )
            rec.usage = await estimate_usage(
                doc,
                protocol.count_kind,  # type: ignore[arg-type]
                output,
                size_hint=ex.raw_size,
                encoding=state.config.telemetry.usage_estimate_encoding,
            )
            rec.usage_estimated = True
        if rec.served_tier and rec.usage is not None and rec.model:
            pool = state.pools.get(rec.model, rec.served_tier)
            if pool is not None:
                rec.cost_usd = cost_usd(rec.usage, pool.config.prices, rec.flex)
                observe_rates(pool.rates, rec)  # the pool's (routing.kv_placement)
        if rec.spent is not None:  # failed attempts' consumption, served or not
            rec.usage = rec.spent if rec.usage is None else add_usage(rec.usage, rec.spent)
            rec.cost_usd = round((rec.cost_usd or 0.0) + rec.spent_cost_usd, USD_DECIMALS)
    except (Exception, asyncio.CancelledError):
        log.exception("usage accounting failed for request %s", rec.request_id)
    state.metrics.record_request(rec)
    if state.auto is not None:  # the auto tier learns from every finished request
        try:
            state.auto.observe(rec)
        except Exception:
            log.exception("auto-tier estimate not updated for request %s", rec.request_id)
    if state.console is not None:  # the console's live windows (gateway.console)
        try:
            state.console.observe(rec)
        except Exception:
            log.exception("console windows not updated for request %s", rec.request_id)
    trace.finish(rec)
    if state.config.server.access_log:
        log_access(rec, state.config.telemetry.access_log_format)
    if rec.key_id or rec.session_id:
        try:
            await state.usage.add(rec.key_id, rec.session_id, UsageDelta.from_record(rec),
                                  parent=rec.parent_session_id)
        except (Exception, asyncio.CancelledError):
            log.exception("usage totals not updated for request %s", rec.request_id)
    await state.sessions.observe(rec, route_key(ex), ex.session_running)


def route_key(ex: Exchange) -> str | None:
    """The routing key of ``ex``'s session: the planned route's, else (refused before it was
    planned) the one a named session routes by; None for a derived session never routed."""
    plan, rec = ex.planned, ex.rec
    if plan is not None and plan.route is not None:
        return plan.route.session_key
    if rec.session_id is None or rec.session_src in (RESPONSES_CHAIN, CONVERSATION):
        return None
    return session_key({}, rec.session_id, scope=rec.key_id)


def observe_rates(rates: PoolRates, rec: RequestRecord) -> None:
    """Feed a pool's prefill/decode rates (``fleet.rates``, for ``routing.kv_placement``) from
    ``rec`` when it is a completed, unresumed stream with usage (a JSON response's TTFT is its
    whole body; a resumed stream's usage sums its attempts; a failed one's times are cut):
    decode time its first to last content event, else ``e2e − ttft − queue`` (seconds, as the
    TPOT metric)."""
    u, itl = rec.usage, rec.itl
    if u is None or not rec.stream or rec.outcome != "ok" or rec.resumes:
        return
    if itl is not None and itl.n:
        decode_s: float | None = itl.span_s
    elif rec.e2e_s is not None and rec.ttft_s is not None:
        decode_s = rec.e2e_s - rec.ttft_s - (rec.queue_s or 0.0)
    else:
        decode_s = None
    rates.observe(u.prompt, u.cached, u.completion, rec.ttft_s, decode_s)
