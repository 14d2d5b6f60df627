"""Flow control's refusals (``QueueRefused``): 503 ``queue_full`` / ``queue_wait_too_long`` /
``queue_timeout`` with a ``Retry-After`` from the pool's drain rate, or OpenAI's 429
``resource_unavailable`` for a flex request; and ``x-speedgate-admit-s``, the seconds from the
request's arrival at the gateway to the refusal."""

from __future__ import annotations

from gateway.errors import GatewayError

REFUSALS = {
    "queue_full": "the pool's queue is full",
    "expected_wait": "the expected wait in the pool's queue exceeds this request's limit",
    "timeout": "the request waited in the pool's queue until its limit",
}
#: Response header of a refusal: seconds from arrival at the gateway to the decision.
ADMIT_TIME_HEADER = "x-speedgate-admit-s"
CODES = {"queue_full": "queue_full", "expected_wait": "queue_wait_too_long",
         "timeout": "queue_timeout"}


class QueueRefused(GatewayError):
    """503 (a flex request: 429 ``resource_unavailable``): the pool cannot start the request
    within its limit. ``reason``: queue_full | expected_wait | timeout."""

    def __init__(self, reason: str, retry_after: float, flex: bool, detail: str = "") -> None:
        msg = f"Overloaded: {REFUSALS[reason]}{detail}; retry after {retry_after:.0f}s."
        if flex:
            super().__init__(msg, status=429, type="rate_limit_error",
                             code="resource_unavailable", retry_after_s=retry_after)
        else:
            super().__init__(msg, status=503, type="server_error", code=CODES[reason],
                             retry_after_s=retry_after)
        self.reason = reason
        self.decision_s: float | None = None

    def headers(self) -> dict[str, str]:
        """``Retry-After`` and, once the admission step timed it, ``x-speedgate-admit-s``:
        seconds from the request's arrival at the gateway to this refusal (the gateway's own
        share of the answer time a client measures)."""
        out = super().headers()
        if self.decision_s is not None:
            out[ADMIT_TIME_HEADER] = f"{self.decision_s:.4f}"
        return out
