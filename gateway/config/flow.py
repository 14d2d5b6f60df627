"""Admission under load: the ``flow_control:`` section (priority bands, the gateway
queue, shedding) and the ``budgets:`` section (session budgets in USD). Units in names."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field, model_validator

from gateway.config.base import _Strict
from gateway.config.process import ApiKeyConfig

BAND_NAME = r"^[a-z][a-z0-9_-]{0,31}$"


class BandConfig(_Strict):
    """One priority band. Bands are strict: a queued request of a band is dispatched only when
    no request of a higher band (earlier in ``flow_control.bands``) waits.

    ``max_queue_s``: the longest a request of this band may wait in the gateway queue; a request
    whose expected wait (from the pool's measured drain rate) exceeds it, or its own deadline,
    is refused at arrival, and one still queued when it passes is refused then. ``max_wait_s``:
    the starvation guard: a request queued longer than this (since arrival) moves up one band,
    ahead of that band's own waiting requests (None = never). ``reserved_share``: share of a
    pool's slots (``max_inflight_per_replica`` × usable replicas) that lower bands may not use,
    so a request of this band (or a higher one) finds a free slot instead of waiting for a
    running request to finish (vLLM does not preempt for a batch slot). Rounded to the nearest
    slot (``saturation.band_limits``): a share under half a slot reserves none, so the default
    10% holds 1 slot of 5 to 14 and none of a 2-slot pool (where ceil held 1 of 2, halving the
    lower bands' throughput for a 10% share); on a tiny pool ask for it (0.5 of 2 slots)."""

    name: str = Field(pattern=BAND_NAME)
    max_queue_s: float = Field(60.0, gt=0)
    max_wait_s: float | None = Field(None, gt=0)
    reserved_share: float = Field(0.0, ge=0, lt=1)


def _default_service_tier_bands() -> dict[Literal["priority", "default", "flex"], str]:
    return {"priority": "interactive", "flex": "batch"}


def _default_bands() -> list[BandConfig]:
    return [
        BandConfig(name="interactive", max_queue_s=10.0, reserved_share=0.1),
        BandConfig(name="standard", max_queue_s=60.0),
        BandConfig(name="batch", max_queue_s=900.0, max_wait_s=60.0),
    ]


class FlowControlConfig(_Strict):
    """The gateway queue in front of saturated pools (``gateway.admit.flow``).

    A pool is saturated when every slot is taken (``max_inflight_per_replica`` × usable
    replicas, minus the slots reserved for higher bands) or when its replicas' scraped
    ``vllm:num_requests_waiting`` exceeds ``max_engine_waiting`` per replica; a pool with
    neither set is never queued. ``bands``: highest priority first. ``default_band``: a request
    with no band from its header, ``service_tier`` or key. ``service_tier_bands``: OpenAI's
    ``service_tier`` → band (``flex`` also gets flex semantics: 429 ``resource_unavailable``
    when refused, the tier's ``prices.flex_share``). ``max_queue_len``: queued requests per
    pool (more are refused at once). ``default_output_tokens``: a request's output estimate
    when it sets no ``max_tokens`` (its cost in the fair queue is prompt + output tokens).
    ``drain_half_life_s``: the half-life of the measured drain rate (estimated tokens
    dispatched per second of backlog). ``recheck_interval_s``: while requests wait, how often
    replica health and scraped engine queues are re-read (a finished request dispatches at
    once). ``first_token_guard_s``: after a request of the top band takes a slot, requests of
lower bands may not take the pool's last free slot for the top band's typical time to first
token (the mean of its measured TTFTs), at most this long (0 = off): their prompts' prefill
would share the full engine step the top band's first token waits for (vLLM batches every
running request's prefill chunk into one step). While another slot stays free they go at once,
and one lower-band request is held at most this long in all (``admit.flow.guard``).
    ``enabled``: false queues nothing (every request goes straight to the engines)."""

    enabled: bool = True
    bands: list[BandConfig] = Field(default_factory=_default_bands, min_length=1)
    default_band: str = "standard"
    service_tier_bands: dict[Literal["priority", "default", "flex"], str] = Field(
        default_factory=_default_service_tier_bands
    )
    max_queue_len: int = Field(10_000, ge=1)
    default_output_tokens: int = Field(256, ge=1)
    drain_half_life_s: float = Field(10.0, gt=0)
    recheck_interval_s: float = Field(0.1, gt=0)
    first_token_guard_s: float = Field(0.5, ge=0)

    @model_validator(mode="after")
    def _check_bands(self) -> FlowControlConfig:
        names = [b.name for b in self.bands]
        if len(set(names)) != len(names):
            raise ValueError("bands: duplicate band name")
        if self.default_band not in names:
            raise ValueError(f"default_band {self.default_band!r} is not a band")
        for tier, band in self.service_tier_bands.items():
            if band not in names:
                raise ValueError(f"service_tier_bands.{tier}: {band!r} is not a band")
        if sum(b.reserved_share for b in self.bands) >= 1:
            raise ValueError("bands: reserved_share must sum to less than 1")
        return self

    def band_index(self, name: str) -> int:
        """Position of band ``name`` (0 = highest priority); ValueError when unknown."""
        for i, b in enumerate(self.bands):
            if b.name == name:
                return i
        raise ValueError(f"unknown band {name!r}")


class BudgetConfig(_Strict):
    """Session budgets in USD (``gateway.admit.budget``): a session (``x-session-id``) whose
    spend reaches its budget is refused with 429 ``session_budget_exceeded``.

    A request's budget is the header ``x-speedgate-session-budget-usd`` capped by its key's
    ``max_session_budget_usd`` (``max_session_budget_usd`` here without a key), else its key's
    ``session_budget_usd``, else ``default_session_budget_usd`` (None: no budget). Spend is the
    cost of the session's finished requests (cached tokens at the cached price); requests in
    flight count at their estimate until they finish. ``soft_share``: past this share of the
    budget ``auto`` picks the cheaper tier. With ``state.redis_url`` the check-and-reserve is
    one Lua script, so every gateway replica sees one spend; ``fail_mode`` decides what Redis
    down means (``open``: admit unchecked; ``closed``: 503). ``reservation_ttl_s``: a request's
    reservation left by a crashed gateway expires after this long. ``session_ttl_s``: a
    session's ledger expires this long after its last request."""

    default_session_budget_usd: float | None = Field(None, gt=0)
    max_session_budget_usd: float | None = Field(None, gt=0)
    soft_share: float = Field(0.8, gt=0, le=1)
    fail_mode: Literal["open", "closed"] = "open"
    reservation_ttl_s: float = Field(3600.0, gt=0)
    session_ttl_s: float = Field(7 * 24 * 3600.0, gt=0)
    redis_prefix: str = "speedgate:budget:"


def check_key_bands(flow: FlowControlConfig, keys: Sequence[ApiKeyConfig], where: str) -> None:
    """Raise ValueError naming ``where`` when a key's ``bands`` or ``default_band`` names no
    configured band, or its default band is not one of its own bands."""
    names = {b.name for b in flow.bands}
    for i, k in enumerate(keys):
        for band in [*(k.bands or ()), *([k.default_band] if k.default_band else [])]:
            if band not in names:
                raise ValueError(f"{where}[{i}] ({k.id}): {band!r} is not a flow_control band")
        if k.bands is not None and k.default_band is not None and k.default_band not in k.bands:
            raise ValueError(f"{where}[{i}] ({k.id}): default_band is not one of its bands")
