"""What the gateway learned about one request (``RequestRecord``): filled along the request
path, read by the access log, the metrics, the usage store and the auto tier."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from gateway.common.usage import Usage
from gateway.telemetry.histograms import GapTimer


@dataclass(slots=True)
class RequestRecord:
    """What the gateway learned about one request. Times in seconds; tokens from the engine."""

    request_id: str
    path: str
    operation: str = "chat"  # gen_ai.operation.name of the path's protocol
    t_start: float = field(default_factory=time.monotonic)
    model: str | None = None
    asked_tier: str | None = None
    served_tier: str | None = None
    tried_tier: str | None = None  # the tier of the last attempt (served or not)
    auto_reason: str | None = None
    fallback: str | None = None
    replica: str | None = None  # name (model/tier/index) of the last replica tried
    stream: bool = False
    attempts: int = 0
    retries: list[str] = field(default_factory=list)
    status: int = 0
    response_started: bool = False
    outcome: str | None = None
    usage: Usage | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    # Telemetry. ``key_id``: the API key's id or name, never the key itself.
    key_id: str | None = None
    session_id: str | None = None
    session_src: str | None = None  # where session_id came from (gateway.admit.session)
    queue_s: float | None = None  # arrival → first upstream attempt sent
    usage_estimated: bool = False  # usage counted by the gateway (tiktoken), not the engine
    cost_usd: float | None = None
    itl: GapTimer | None = None  # inter-token gaps of the relayed stream
    trace_id: str | None = None  # hex W3C trace id of the request span
    auto_choice: Any = None  # gateway.plan.auto.service.AutoChoice of an auto request
    # Admission under load: priority band, OpenAI flex semantics, gateway queue wait
    band: str | None = None
    flex: bool = False
    queue_wait_s: float | None = None  # None: the request did not wait in the gateway queue
    # Mid-stream resume: one entry per break after content reached the client
    # (``reason``, ``outcome``, ``rule`` when refused, ``from_tier``, ``to_tier``,
    # ``carried_chars``: the length of the text carried into the continuation)
    resumes: list[dict[str, Any]] = field(default_factory=list)
    # KV capacity (routing.kv_placement): "stay" (the session's replica had room), "move"
    # (it had none and re-prefilling elsewhere was quicker) or "wait" (it stayed and queues);
    # ``kv_figures`` the seconds weighed ("move_s=… wait_s=…"); None when not weighed
    kv_placement: str | None = None
    kv_figures: str | None = None

    def set_usage(self, usage: Any) -> None:
        """Record an OpenAI ``usage`` object (ignored when absent or malformed)."""
        self.usage = Usage.from_openai(usage)
