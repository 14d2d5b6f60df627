"""Start-up advice on a valid but risky configuration: what ``speedgate serve`` and
``speedgate check-config`` print to stderr before serving (or after checking).

``server.workers > 1`` without ``state.redis_url``: each uvicorn worker keeps its own memory,
so state that Redis would share is silently per process (a follow-up lands on another worker
about ``1 - 1/workers`` of the time). This is a warning, not a refusal: a stateless proxy (no
sessions, no stored Responses, no per-key limits) is served correctly by several workers, and
refusing would break such a deployment on upgrade; every feature the config turns on that
Redis would share is named, so the user knows what to expect or to set ``state.redis_url``.
"""

from __future__ import annotations

from gateway.config.load import GatewayConfig


def per_process_state(config: GatewayConfig) -> list[str]:
    """What the config keeps per worker process when it has no ``state.redis_url`` (short
    phrases, in the order a user meets them). Always: session affinity, stored Responses,
    cancellation and usage totals; per-key rate limits when a key has limits (or keys come from
    ``auth.keys_file``, read later); session budgets when any budget is configured."""
    out = ["session affinity (x-session-id routing)",
           "stored Responses (previous_response_id, GET/DELETE /v1/responses: 404 on another "
           "worker)",
           "cancellation of a request served by another worker",
           "usage totals (/v1/usage)"]
    keys = config.auth.keys
    if config.auth.keys_file or any(
        k.limits.requests_per_min or k.limits.tokens_per_min or k.limits.concurrent
        for k in keys
    ):
        out.append("per-key rate limits and concurrency (each worker admits the full limit)")
    if (config.budgets.default_session_budget_usd or config.budgets.max_session_budget_usd
            or any(k.session_budget_usd or k.max_session_budget_usd for k in keys)):
        out.append("session budgets (each worker keeps its own spend)")
    return out


def workers_warning(config: GatewayConfig) -> str | None:
    """The warning for ``server.workers > 1`` without ``state.redis_url`` (None when it does
    not apply): one line naming the per-process state (``per_process_state``), then the fix."""
    workers = config.server.workers
    if workers <= 1 or config.state.redis_url:
        return None
    return (f"WARNING: server.workers is {workers} but state.redis_url is not set, so each of "
            f"the {workers} worker processes keeps its own: "
            + "; ".join(per_process_state(config))
            + ". Set state.redis_url to share them, or server.workers: 1.")
