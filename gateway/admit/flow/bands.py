"""A request's priority band. Pure.

First match wins:

1. header ``x-speedgate-priority: <band>`` (a configured band name): 400 when it names no band,
   403 ``priority_not_allowed`` when the API key's ``bands`` exclude it;
2. OpenAI's ``service_tier`` through ``flow_control.service_tier_bands`` (default ``priority`` →
   interactive, ``flex`` → batch); ``flex`` also brings OpenAI's flex semantics (the request
   may wait long, is refused with 429 ``resource_unavailable`` when there is no capacity, and
   pays the tier's ``prices.flex_share``);
3. the key's ``default_band``; 4. ``flow_control.default_band``.

A band from 2-4 that the key may not use is narrowed to the nearest band it may use, lower
priority first (never a 403: the client did not name the band). The tier is chosen separately
(``gateway.plan.tiers``: ``priority`` → fast, ``flex`` → standard).
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.admit.auth import PermissionDenied
from gateway.config import ApiKeyConfig, FlowControlConfig
from gateway.errors import InvalidRequest

HEADER = "x-speedgate-priority"


@dataclass(frozen=True, slots=True)
class BandChoice:
    """``index`` (0 = highest priority) and ``name`` of the band; ``flex``: OpenAI flex
    semantics apply; ``source``: header | service_tier | key | default."""

    index: int
    name: str
    flex: bool
    source: str


def resolve_band(
    flow: FlowControlConfig,
    key: ApiKeyConfig | None,
    header: str | None,
    service_tier: object,
) -> BandChoice:
    """The band of one request by the rules in the module docstring. Raises
    ``InvalidRequest`` (400) or ``PermissionDenied`` (403) for a bad header."""
    names = [b.name for b in flow.bands]
    allowed = set(key.bands) if key is not None and key.bands is not None else set(names)
    if header is not None:
        name = header.strip().lower()
        if name not in names:
            raise InvalidRequest(
                f"{HEADER} must be one of {', '.join(names)}; got {header[:40]!r}", param=HEADER
            )
        if name not in allowed:
            raise PermissionDenied(
                f"This API key may not use the {name} priority band.",
                code="priority_not_allowed",
                param=HEADER,
            )
        return BandChoice(names.index(name), name, False, "header")
    flex = service_tier == "flex"
    mapped = (flow.service_tier_bands.get(service_tier)
              if service_tier in ("priority", "default", "flex") else None)
    if mapped is not None:
        name, source = mapped, "service_tier"
    elif key is not None and key.default_band is not None:
        name, source = key.default_band, "key"
    else:
        name, source = flow.default_band, "default"
    index = nearest_allowed(names, names.index(name), allowed)
    return BandChoice(index, names[index], flex, source)


def nearest_allowed(names: list[str], index: int, allowed: set[str]) -> int:
    """``index`` when its band is allowed, else the nearest allowed band below it (lower
    priority), else the nearest above; ``index`` when none is allowed."""
    for i in range(index, len(names)):
        if names[i] in allowed:
            return i
    for i in range(index - 1, -1, -1):
        if names[i] in allowed:
            return i
    return index
