"""Cost of one request in USD from its token usage and the serving tier's prices. Pure.

Prices are USD per 1M tokens (config ``Prices``, the unit of OpenAI's pricing page). Cached
input tokens are part of ``prompt_tokens`` (OpenAI's ``usage.prompt_tokens_details.
cached_tokens``) and are billed at the cached price instead of the input price, never twice
(case cost-cached-tokens):

    cost = (uncached × input + cached × cached_input + output × output) / 1e6
    uncached = prompt_tokens − cached_tokens

A cached count above ``prompt_tokens`` (a malformed usage) is clamped to ``prompt_tokens``.
The result is rounded to 1e-12 USD so that float noise (``0.1`` is not exact in binary) never
shows: the failure case's usage costs exactly ``0.000878``.
"""

from __future__ import annotations

from typing import Protocol

from gateway.common.usage import Usage

USD_DECIMALS = 12


class TierPrices(Protocol):
    """What ``cost_usd`` reads of a price list (``gateway.config.Prices`` has these), read-only
    (the configuration's models are frozen)."""

    @property
    def input_per_mtok_usd(self) -> float: ...
    @property
    def cached_input_per_mtok_usd(self) -> float: ...
    @property
    def output_per_mtok_usd(self) -> float: ...
    @property
    def flex_share(self) -> float: ...


def token_split(usage: Usage) -> tuple[int, int, int]:
    """``(uncached_input, cached_input, output)`` tokens of ``usage`` (negatives read as 0)."""
    prompt = max(0, usage.prompt)
    cached = min(max(0, usage.cached), prompt)
    return prompt - cached, cached, max(0, usage.completion)


def cost_usd(usage: Usage | None, prices: TierPrices, flex: bool = False) -> float:
    """USD cost of ``usage`` at ``prices``; 0.0 when there is no usage. ``flex``: a
    ``service_tier: flex`` request, billed at ``prices.flex_share`` of every price (OpenAI
    prices flex at Batch API rates)."""
    if usage is None:
        return 0.0
    uncached, cached, output = token_split(usage)
    micro = (
        uncached * prices.input_per_mtok_usd
        + cached * prices.cached_input_per_mtok_usd
        + output * prices.output_per_mtok_usd
    )
    if flex:
        micro *= prices.flex_share
    return round(micro / 1e6, USD_DECIMALS)
