"""Step 5 of a request, account: usage (estimated with tiktoken when the engine sent none),
cost, metrics, the request span, the access log line and the per-key/per-session totals.

Runs once per request on every exit path, after the response ended (or failed).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from gateway.state import GatewayState
from gateway.telemetry.access_log import log_access
from gateway.telemetry.cost import cost_usd
from gateway.telemetry.record import RequestRecord
from gateway.telemetry.tokencount import estimate_usage
from gateway.telemetry.tracing import RequestTrace
from gateway.telemetry.usage_store import UsageDelta

if TYPE_CHECKING:
    from gateway.protocols.base import Protocol

log = logging.getLogger("speedgate.accounting")


async def account(
    state: GatewayState,
    rec: RequestRecord,
    trace: RequestTrace,
    *,
    protocol: Protocol,
    doc: dict[str, Any] | None,
    raw_size: int,
    relayed: list[bytes],
    response_doc: dict[str, Any] | None,
) -> None:
    """Finish ``rec`` and record it everywhere. ``doc``: the request's chat-shaped conversation
    (``ParsedBody.conversation``; None when it never parsed), counted with the ``protocol``'s
    rule when the engine reported no usage; ``relayed``: the stream payloads sent to the
    client; ``response_doc``: the JSON response sent. Never raises (a failure here is logged,
    the request is already answered)."""
    rec.e2e_s = time.monotonic() - rec.t_start
    try:
        if rec.served_tier and rec.usage is None and doc is not None and protocol.generates:
            output = (
                protocol.output_text(relayed)
                if rec.stream
                else protocol.json_output_text(response_doc or {})
            )
            rec.usage = await estimate_usage(
                doc,
                protocol.count_kind,  # type: ignore[arg-type]
                output,
                size_hint=raw_size,
                encoding=state.config.telemetry.usage_estimate_encoding,
            )
            rec.usage_estimated = True
        if rec.served_tier and rec.usage is not None and rec.model:
            pool = state.pools.get(rec.model, rec.served_tier)
            if pool is not None:
                rec.cost_usd = cost_usd(rec.usage, pool.config.prices, rec.flex)
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
            await state.usage.add(rec.key_id, rec.session_id, UsageDelta.from_record(rec))
        except (Exception, asyncio.CancelledError):
            log.exception("usage totals not updated for request %s", rec.request_id)
