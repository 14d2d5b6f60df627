"""What the gateway learned about one request (``RequestRecord``): filled along the request
path, read by the access log, the metrics, the usage store and the auto tier."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from gateway.common.usage import Usage
from gateway.telemetry.histograms import GapTimer

#: Characters of a client's model name or tier kept for the access log.
MAX_ASKED_CHARS = 200


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
    # what attempts that failed before the answer consumed, as their engines reported it
    # (``account`` adds it to ``usage`` and ``cost_usd``)
    spent: Usage | None = None
    spent_cost_usd: float = 0.0
    ttft_s: float | None = None
    e2e_s: float | None = None
    # Telemetry. ``key_id``: the API key's id or name, never the key itself.
    key_id: str | None = None
    session_id: str | None = None
    session_src: str | None = None  # where session_id came from (gateway.admit.session)
    # a subagent's session: its parent's and, when another, its tree's root session
    parent_session_id: str | None = None
    root_session_id: str | None = None
    session_end: bool = False  # ``x-speedgate-session-end``: the session ends with this request
    # what the client asked, as sent (bounded), kept for the access log of a request refused
    # before it was planned; ``model``/``asked_tier``/``stream`` are the resolved ones
    client_model: str | None = None
    client_tier: str | None = None
    client_stream: bool | None = None
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
    #: ``lowered asked=B prompt=A max_model_len=C`` when the request was sent without the
    #: output cap it asked for (prompt + cap fit no replica; ``plan.kv_fit``), else None
    output_cap: str | None = None

    def set_usage(self, usage: Any) -> None:
        """Record an OpenAI ``usage`` object (ignored when absent or malformed)."""
        self.usage = Usage.from_openai(usage)

    def note_asked(self, doc: dict[str, Any]) -> None:
        """Keep the ``model`` (a string, at most ``MAX_ASKED_CHARS`` characters) and
        ``stream`` the client's body asked for (``client_model``, ``client_stream``)."""
        model = doc.get("model")
        if isinstance(model, str):
            self.client_model = model[:MAX_ASKED_CHARS]
        self.client_stream = doc.get("stream") is True
