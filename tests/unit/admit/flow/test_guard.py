"""The first-token guard's pure state (gateway/admit/flow/guard.py)."""

from __future__ import annotations

from gateway.admit.flow.guard import FirstTokenGuard


def test_renew_holds_for_the_learned_ttft_capped():
    g = FirstTokenGuard(0.5)
    assert g.renew(10.0) is None and g.until == 0.0  # nothing learned: no guard
    g.learn(0.25)
    assert g.renew(10.0) == 0.25 and g.until == 10.25
    assert g.renew(10.0) is None  # already held that long
    g.learn(2.25)  # EWMA: 0.25 + 0.2 * 2.0 = 0.65, capped at 0.5
    assert g.renew(10.0) == 0.5 and g.until == 10.5
    off = FirstTokenGuard(0.0)
    off.learn(0.25)
    assert off.renew(10.0) is None


def test_binds_only_while_due_and_never_past_the_cap_for_one_waiter():
    g = FirstTokenGuard(0.5)
    g.learn(0.5)
    g.renew(10.0)
    assert g.binds(10.25, None)  # due, nobody waiting yet
    assert g.binds(10.25, 10.0)  # the oldest has waited 0.25 s
    assert not g.binds(10.25, 9.75)  # it has waited 0.5 s: released
    assert not g.binds(10.5, None)  # the first token is no longer due
