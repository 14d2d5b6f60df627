"""The access log: one line per request with ids, tier, replica, status, tokens and timings.

Never the prompt, the completion or an API key (DESIGN §10). Replica URLs are redacted.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from gateway.relay import Usage

access_log = logging.getLogger("speedgate.access")


@dataclass(slots=True)
class RequestRecord:
    """What the gateway learned about one request. Times in seconds; tokens from the engine."""

    request_id: str
    path: str
    t_start: float = field(default_factory=time.monotonic)
    model: str | None = None
    asked_tier: str | None = None
    served_tier: str | None = None
    auto_reason: str | None = None
    fallback: str | None = None
    replica: str | None = None
    stream: bool = False
    attempts: int = 0
    retries: list[str] = field(default_factory=list)
    status: int = 0
    outcome: str | None = None
    usage: Usage | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None

    def set_usage(self, usage: Any) -> None:
        """Record an OpenAI ``usage`` object (ignored when absent or malformed)."""
        self.usage = Usage.from_openai(usage)


def log_request(rec: RequestRecord) -> None:
    """Emit the access log line for ``rec`` (logger ``speedgate.access``, level INFO)."""
    if not access_log.isEnabledFor(logging.INFO):
        return
    u = rec.usage
    access_log.info(
        "request_id=%s path=%s model=%s tier_asked=%s tier=%s fallback=%s replica=%s stream=%s "
        "attempts=%d status=%d outcome=%s prompt_tokens=%s cached_tokens=%s "
        "completion_tokens=%s ttft_s=%s e2e_s=%.4f",
        rec.request_id,
        rec.path,
        rec.model,
        rec.asked_tier,
        rec.served_tier,
        rec.fallback,
        rec.replica,
        rec.stream,
        rec.attempts,
        rec.status,
        rec.outcome,
        u.prompt if u else None,
        u.cached if u else None,
        u.completion if u else None,
        f"{rec.ttft_s:.4f}" if rec.ttft_s is not None else None,
        rec.e2e_s or 0.0,
    )
