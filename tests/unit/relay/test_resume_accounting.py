"""What a resumed request's usage counts for its broken attempts (``_produced_tokens``): the
engine's count of the carried text when the continuation got it, else the estimate."""

from __future__ import annotations

from gateway.protocols.base import ResumePoint
from gateway.relay.resume import _produced_tokens
from gateway.telemetry.tokencount import count_text


def test_the_engines_count_of_the_carried_text_plus_the_healed_tail() -> None:
    point = ResumePoint(text="morning small always", heal=" always", tokens=7)
    assert _produced_tokens(point) == 7  # no count from the engine: the estimate
    point.carried_tokens = 2  # "morning small", as the engine counts it
    assert _produced_tokens(point) == 2 + count_text(" always")
    point.heal = ""  # after a divergence the whole text is carried (and counted)
    point.carried_tokens = 3
    assert _produced_tokens(point) == 3
