"""Performance model: expected tokens, speedup at low load, slowdown under heavy load."""

import random

import pytest

from engines.sim.perf import PerfModel, expected_tokens_per_step

SPEC = PerfModel(num_speculative_tokens=4, acceptance_rate=0.7)
STD = PerfModel()


def test_expected_tokens_formula() -> None:
    assert expected_tokens_per_step(4, 0.7) == pytest.approx((1 - 0.7**5) / 0.3)
    assert expected_tokens_per_step(0, 0.7) == 1.0
    assert expected_tokens_per_step(3, 1.0) == 4.0
    assert expected_tokens_per_step(5, 0.0) == 1.0


def test_draws_match_expectation() -> None:
    rng = random.Random(1)
    n = 50_000
    mean = sum(SPEC.draw_accepted(rng) + 1 for _ in range(n)) / n
    assert mean == pytest.approx(SPEC.tokens_per_step(), rel=0.02)
    assert all(0 <= SPEC.draw_accepted(rng) <= 4 for _ in range(1000))


def test_speedup_at_batch_1_in_published_range() -> None:
    assert 1.5 <= SPEC.speedup(1) <= 2.8


def test_slowdown_under_heavy_load_in_published_range() -> None:
    slowdown = 1 / SPEC.speedup(256)
    assert 1.4 <= slowdown <= 1.8


def test_speedup_shrinks_with_batch() -> None:
    values = [SPEC.speedup(b) for b in (1, 8, 32, 64, 128, 256)]
    assert values == sorted(values, reverse=True)


def test_standard_step_grows_with_batch_and_idle_is_free() -> None:
    assert STD.step_s(0) == 0
    assert STD.step_s(1) == pytest.approx(0.0121)
    assert STD.step_s(256) > STD.step_s(1)
    assert STD.tpot_s(8) == STD.step_s(8)
    assert STD.prefill_s(1000) == pytest.approx(0.07)


def test_every_forward_pass_reads_the_weights_once() -> None:
    """A prefill-only step pays the weight read (decode_base_ms) like a decode step; a mixed
    step pays it once; an empty step is free."""
    assert STD.forward_s(0, 0) == 0
    assert STD.forward_s(0, 100) == pytest.approx(0.012 + 0.007)
    assert STD.forward_s(8, 100) == pytest.approx(STD.step_s(8) + 0.007)
    assert SPEC.forward_s(0, 100) == pytest.approx(0.012 + 0.007)
