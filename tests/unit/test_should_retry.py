"""``x-should-retry``, the hint the Stainless SDKs (``openai``, ``anthropic``) obey before their
own status rules: ``false`` where a retry repeats the failure, ``true`` where it helps."""

from __future__ import annotations

import pytest

from gateway.admit.budget import BudgetExceeded
from gateway.errors import GatewayError, NoHealthyReplica, should_retry
from gateway.protocols.error_shapes import ANTHROPIC_ERRORS, OPENAI_ERRORS


@pytest.mark.parametrize(("status", "retry_after", "want"), [
    (400, False, "false"), (401, False, "false"), (403, False, "false"), (404, False, "false"),
    (405, False, "false"), (413, False, "false"), (415, False, "false"), (422, False, "false"),
    (408, False, None), (409, False, None),  # the SDKs' own rule retries these
    (429, False, "true"), (429, True, "true"),
    (503, True, "true"), (503, False, None), (529, False, "true"),
    (500, False, None), (502, False, None), (504, False, None),
])
def test_should_retry_table(status: int, retry_after: bool, want: str | None) -> None:
    assert should_retry(status, retry_after) == want


def test_budget_refusal_is_never_retried() -> None:
    e = BudgetExceeded(1.0, 0.0)
    assert e.status == 429 and e.headers()["x-should-retry"] == "false"
    assert (b"x-should-retry", b"false") in ANTHROPIC_ERRORS.headers(e)


def test_hint_follows_the_status_each_api_answers() -> None:
    no_retry_after = GatewayError("engine failed", status=503)
    assert "x-should-retry" not in dict(OPENAI_ERRORS.headers(no_retry_after))
    # Anthropic's answer for the gateway's 503 is 529 overloaded: retry
    assert dict(ANTHROPIC_ERRORS.headers(no_retry_after))[b"x-should-retry"] == b"true"
    e = NoHealthyReplica("none", retry_after_s=2)
    assert dict(OPENAI_ERRORS.headers(e))[b"x-should-retry"] == b"true"
    bad = GatewayError("bad", status=400)
    assert dict(ANTHROPIC_ERRORS.headers(bad))[b"x-should-retry"] == b"false"
