"""Shared pieces of the config schema: the tier names and the strict base of every section."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
)

Tier = Literal["standard", "fast"]
TierChoice = Literal["standard", "fast", "auto"]
TIERS: tuple[Tier, ...] = ("standard", "fast")


class _Strict(BaseModel):
    """Base for config sections: unknown keys are errors, values are frozen after load."""

    model_config = ConfigDict(extra="forbid", frozen=True)
