"""What a failed attempt means for its request, as a table (``upstream.verdict``): the failures
held back and the new failure in; what is held from now on, whose failures are recorded, and
whether the request is answered now out. Both diagnoses are rows: the stream-4xx diagnosis
(asked again once; a second in-stream 4xx is the client's answer) and the body rule (a second
replica failing the same way is the body's fault, counted against neither). No I/O."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gateway.config import PoolConfig
from gateway.fleet.pools import Pool, Replica
from gateway.upstream.failures import Failure
from gateway.upstream.verdict import (
    Diagnosis,
    Failed,
    after_all,
    after_failure,
    after_success,
)

CFG = PoolConfig(endpoints=[f"http://10.0.0.{i}:8000" for i in range(3)], served_model_name="m")
POOL = Pool("m", "standard", CFG)
R = [Replica(u, POOL.key, name=f"{POOL.key}/{i}") for i, u in enumerate(CFG.endpoint_urls())]


def F(replica: int, kind: Failure) -> Failed:
    return Failed(POOL, R[replica], kind)


@dataclass(frozen=True)
class Row:
    """``held`` (stream-4xx suspect, body suspect), the new ``failed``; wanted: the held-back
    pair after, the charged failures, the answer."""

    held: tuple[Failed | None, Failed | None]
    failed: Failed
    held_after: tuple[Failed | None, Failed | None]
    charge: tuple[Failed, ...]
    answer: str | None = None


S4 = Failure.STREAM_4XX
ROWS = {
    "a broken connection counts at once": Row(
        (None, None), F(0, Failure.BROKEN_STREAM), (None, None), (F(0, Failure.BROKEN_STREAM),)),
    "a busy engine (429) is not broken": Row(
        (None, None), F(0, Failure.HTTP_BUSY), (None, None), ()),
    "an overload is not broken": Row((None, None), F(0, Failure.OVERLOADED), (None, None), ()),
    # the stream-4xx diagnosis
    "a first stream-4xx is held, not counted": Row(
        (None, None), F(0, S4), (F(0, S4), None), ()),
    "a second stream-4xx is the client's answer, nobody's failure": Row(
        (F(0, S4), None), F(1, S4), (F(0, S4), None), (), "client-error"),
    "after a stream-4xx another failure counts; the suspect stays held": Row(
        (F(0, S4), None), F(1, Failure.TTFT_TIMEOUT), (F(0, S4), None),
        (F(1, Failure.TTFT_TIMEOUT),)),
    # the body rule
    "a 500 is held back (the body may cause it)": Row(
        (None, None), F(0, Failure.HTTP_500), (None, F(0, Failure.HTTP_500)), ()),
    "a second 500 is the body's fault, counted against neither": Row(
        (None, F(0, Failure.HTTP_500)), F(1, Failure.HTTP_500), (None, None), (), "body-fault"),
    "an engine error after a 500: the 500 counts, the new one is held": Row(
        (None, F(0, Failure.HTTP_500)), F(1, Failure.ENGINE_ERROR),
        (None, F(1, Failure.ENGINE_ERROR)), (F(0, Failure.HTTP_500),)),
    "a timeout after a 500: both count": Row(
        (None, F(0, Failure.HTTP_500)), F(1, Failure.TTFT_TIMEOUT), (None, None),
        (F(0, Failure.HTTP_500), F(1, Failure.TTFT_TIMEOUT))),
    "a stream-4xx after a 500: the 500 counts, the 4xx is held": Row(
        (None, F(0, Failure.HTTP_500)), F(1, S4), (F(1, S4), None), (F(0, Failure.HTTP_500),)),
    "both rules at once: the second 4xx answers, the body suspect counts": Row(
        (F(0, S4), F(1, Failure.ENGINE_ERROR)), F(2, S4), (F(0, S4), None),
        (F(1, Failure.ENGINE_ERROR),), "client-error"),
}


@pytest.mark.parametrize("name", list(ROWS))
def test_verdict(name: str) -> None:
    row = ROWS[name]
    v = after_failure(Diagnosis(*row.held), row.failed)
    assert (v.diagnosis.stream_4xx, v.diagnosis.body) == row.held_after
    assert v.charge == row.charge
    assert v.answer == row.answer


def test_a_success_charges_what_the_suspects_failed() -> None:
    held = Diagnosis(F(0, S4), F(1, Failure.HTTP_500))
    assert after_success(held) == (F(0, S4), F(1, Failure.HTTP_500))
    assert after_success(Diagnosis()) == ()


def test_nothing_left_to_ask_charges_the_body_suspect_only() -> None:
    assert after_all(Diagnosis(F(0, S4), F(1, Failure.HTTP_500))) == (F(1, Failure.HTTP_500),)
    assert after_all(Diagnosis(F(0, S4))) == ()
