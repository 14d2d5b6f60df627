"""The access log: one line per request with ids, tier, replica, status, tokens and timings.

Never the prompt, the completion or an API key. Replicas are named
``model/tier/index``, never by address. ``tier`` and ``replica`` are the ones that served, or,
when none did (an error, a client gone before the first byte: 499), the last ones tried.
Two formats: ``text`` (``key=value`` pairs, the default; a value with anything beyond
``[A-Za-z0-9._:/@+,-]`` is written as a JSON string literal, ASCII-escaped, so a client-supplied
value such as ``x-session-id: a key_id=admin`` can add neither a field nor a line) and ``json``
(one JSON object per line,
fields of ``access_fields``; ``configure_access_log("json")`` makes the logger write bare JSON
lines to a stream for log shippers).
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import IO, Any, Literal

import orjson

from gateway.telemetry.record import RequestRecord

AccessLogFormat = Literal["text", "json"]

access_log = logging.getLogger("speedgate.access")

_BARE = re.compile(r"[A-Za-z0-9._:/@+,\-]+")


def quote_value(value: object) -> str:
    """``value`` as one token of a ``key=value`` line: bare when it is made only of
    ``[A-Za-z0-9._:/@+,-]`` (ids, tiers, replica names, numbers; None as ``None``), else a JSON
    string literal with every quote, backslash, control and non-ASCII character escaped."""
    text = value if isinstance(value, str) else str(value)
    if _BARE.fullmatch(text):
        return text
    return json.dumps(text)


def asked_stream(rec: RequestRecord) -> bool:
    """Whether the request streams: as planned, else (refused before it was planned) as the
    client's body asked."""
    return rec.stream or bool(rec.model is None and rec.client_stream)


def log_request(rec: RequestRecord) -> None:
    """Emit the access log line for ``rec`` (logger ``speedgate.access``, level INFO)."""
    if not access_log.isEnabledFor(logging.INFO):
        return
    u = rec.usage
    access_log.info(
        "request_id=%s key_id=%s session_id=%s session_src=%s path=%s model=%s tier_asked=%s "
        "tier=%s fallback=%s replica=%s stream=%s "
        "attempts=%d resumes=%d status=%d outcome=%s prompt_tokens=%s cached_tokens=%s "
        "completion_tokens=%s usage_estimated=%s cost_usd=%s ttft_s=%s e2e_s=%.4f%s",
        quote_value(rec.request_id),
        quote_value(rec.key_id),
        quote_value(rec.session_id),
        quote_value(rec.session_src),
        quote_value(rec.path),
        quote_value(rec.model or rec.client_model),
        quote_value(rec.asked_tier or rec.client_tier),
        quote_value(rec.served_tier or rec.tried_tier),
        quote_value(rec.fallback),
        quote_value(rec.replica),
        asked_stream(rec),
        rec.attempts,
        len(rec.resumes),
        rec.status,
        quote_value(rec.outcome),
        u.prompt if u else None,
        u.cached if u else None,
        u.completion if u else None,
        rec.usage_estimated,
        f"{rec.cost_usd:.8f}" if rec.cost_usd is not None else None,
        f"{rec.ttft_s:.4f}" if rec.ttft_s is not None else None,
        rec.e2e_s or 0.0,
        (f" kv_placement={rec.kv_placement}" if rec.kv_placement else "")
        + (f" {rec.kv_figures}" if rec.kv_figures else "")
        + (f" output_cap={rec.output_cap.replace(' ', ',')}" if rec.output_cap else ""),
    )


def _r(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(x, digits)


def access_fields(rec: RequestRecord) -> dict[str, Any]:
    """The fields of the JSON access line (times in seconds, cost in USD). No text, no key."""
    u = rec.usage
    return {
        "ts": datetime.now(UTC).isoformat(timespec="milliseconds"),
        "request_id": rec.request_id,
        "trace_id": rec.trace_id,
        "key_id": rec.key_id,
        "session_id": rec.session_id,
        "session_src": rec.session_src,
        "path": rec.path,
        "model": rec.model or rec.client_model,
        "tier_asked": rec.asked_tier or rec.client_tier,
        "tier": rec.served_tier or rec.tried_tier,
        "auto_reason": rec.auto_reason,
        "fallback": rec.fallback,
        "kv_placement": rec.kv_placement,
        "kv_figures": rec.kv_figures,
        "output_cap": rec.output_cap,
        "replica": rec.replica,
        "stream": asked_stream(rec),
        "attempts": rec.attempts,
        "retries": rec.retries,
        "resumes": rec.resumes,
        "status": rec.status,
        "outcome": rec.outcome,
        "prompt_tokens": u.prompt if u else None,
        "cached_tokens": u.cached if u else None,
        "completion_tokens": u.completion if u else None,
        "usage_estimated": rec.usage_estimated,
        "cost_usd": rec.cost_usd,
        "queue_s": _r(rec.queue_s, 6),
        "ttft_s": _r(rec.ttft_s),
        "e2e_s": _r(rec.e2e_s),
    }


def format_json(rec: RequestRecord) -> str:
    """One JSON object (a single line) describing ``rec``."""
    return orjson.dumps(access_fields(rec)).decode()


def log_request_json(rec: RequestRecord) -> None:
    """Emit ``rec`` as one JSON line on the access logger (level INFO)."""
    if access_log.isEnabledFor(logging.INFO):
        access_log.info("%s", format_json(rec))


def log_access(rec: RequestRecord, fmt: AccessLogFormat = "text") -> None:
    """Emit the access line of ``rec`` in ``fmt``."""
    if fmt == "json":
        log_request_json(rec)
    else:
        log_request(rec)


def configure_access_log(fmt: AccessLogFormat, stream: IO[str] | None = None) -> None:
    """For ``json``: the access logger writes bare JSON lines (no timestamp/level prefix) to
    ``stream`` (stdout by default) and stops propagating to the root handlers. For ``text``:
    back to propagating through the root logger's format."""
    for h in list(access_log.handlers):
        if getattr(h, "_speedgate_json", False):
            access_log.removeHandler(h)
    if fmt == "json":
        handler = logging.StreamHandler(stream or sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler._speedgate_json = True  # type: ignore[attr-defined]
        access_log.addHandler(handler)
        access_log.propagate = False
        if access_log.level == logging.NOTSET or access_log.level > logging.INFO:
            access_log.setLevel(logging.INFO)
    else:
        access_log.propagate = True
