"""Cost from usage and tier prices (case cost-cached-tokens)."""

import pytest

from gateway.common.usage import Usage
from gateway.config import Prices
from gateway.telemetry.cost import cost_usd, token_split

PRICES = Prices(input_per_mtok_usd=1.00, cached_input_per_mtok_usd=0.10, output_per_mtok_usd=2.00)


def test_cost_cached_tokens_case_exactly():
    usage = Usage.from_openai(
        {"prompt_tokens": 2006, "completion_tokens": 300,
         "prompt_tokens_details": {"cached_tokens": 1920}}
    )
    assert usage is not None
    assert token_split(usage) == (86, 1920, 300)
    # (86 × 1.00 + 1920 × 0.10 + 300 × 2.00) / 1e6: cached tokens billed once, at the cached price
    assert cost_usd(usage, PRICES) == 0.000878


def test_no_usage_costs_nothing_and_free_tier_is_free():
    assert cost_usd(None, PRICES) == 0.0
    assert cost_usd(Usage(1000, 1000, 10), Prices()) == 0.0


def test_uncached_only_and_malformed_cached_is_clamped():
    assert cost_usd(Usage(prompt=1_000_000, completion=0), PRICES) == 1.0
    assert cost_usd(Usage(prompt=0, completion=1_000_000), PRICES) == 2.0
    # more cached than prompt: all prompt tokens at the cached price, never a negative count
    assert token_split(Usage(prompt=100, completion=0, cached=150)) == (0, 100, 0)
    assert cost_usd(Usage(prompt=100, completion=0, cached=150), PRICES) == 0.00001


def test_flex_pays_the_flex_share():
    """service_tier flex is billed at Batch API rates (prices.flex_share, 50% by default)."""
    usage = Usage(prompt=1_000_000, completion=1_000_000)
    assert cost_usd(usage, PRICES, flex=True) == pytest.approx(cost_usd(usage, PRICES) * 0.5)
