"""The failure table (``gateway.upstream.failures``): every reason the attempt, the failover and
the relay produce has a kind, and each kind's properties are the ones the retry, outlier and
resume rules were written with."""

from __future__ import annotations

import pytest

from gateway.upstream.failures import TRAITS, Failure, failure_kind, traits


@pytest.mark.parametrize(("reason", "kind"), [
    ("http-500", Failure.HTTP_500), ("http-503", Failure.HTTP_5XX), ("http-502", Failure.HTTP_5XX),
    ("http-429", Failure.HTTP_BUSY), ("http-408", Failure.HTTP_BUSY),
    ("http-204", Failure.HTTP_UNEXPECTED), ("http-302", Failure.HTTP_UNEXPECTED),
    ("stream-4xx", Failure.STREAM_4XX), ("ttft-timeout", Failure.TTFT_TIMEOUT),
])
def test_reasons_sort_into_kinds(reason: str, kind: Failure) -> None:
    assert failure_kind(reason) is kind


def test_every_kind_has_its_row_and_an_unknown_reason_none() -> None:
    assert set(TRAITS) == set(Failure)
    with pytest.raises(ValueError):
        failure_kind("no-such-reason")


# reason: (replica's fault, retry elsewhere, spends budget, body suspect, resumable)
ROWS = {
    "connect-error": (True, True, False, False, True),
    "connect-timeout": (True, True, True, False, True),
    "ttft-timeout": (True, True, True, False, True),
    "broken-stream": (True, True, True, False, True),
    "eof": (True, True, True, False, True),
    "stall-timeout": (True, True, True, False, True),
    "malformed": (True, True, True, False, True),
    "engine-error": (True, True, True, True, True),
    "stream-4xx": (False, True, False, False, False),
    "overloaded": (False, True, True, False, True),
    "http-500": (True, True, True, True, True),
    "http-503": (True, True, True, False, True),
    "http-429": (False, True, True, False, True),
    "http-408": (False, True, True, False, True),
    "total-timeout": (False, False, False, False, False),
    "unreadable": (False, False, False, False, False),
    "client-error": (True, False, False, False, False),
    "diverged": (False, True, False, False, True),
}


@pytest.mark.parametrize("reason", sorted(ROWS))
def test_properties_of_each_kind(reason: str) -> None:
    t = traits(reason)
    assert (t.replica_fault, t.retry_elsewhere, t.spends_budget, t.body_suspect,
            t.resumable) == ROWS[reason]
