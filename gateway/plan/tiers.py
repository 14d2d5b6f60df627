"""Tier selection: which model and which tier a request asks for. Pure.

First match wins: header ``x-speedgate-tier`` (standard | fast | auto); a configured model alias
(``mymodel-fast``); OpenAI's ``service_tier`` (``priority`` → fast, ``default``/``flex``/``scale``
→ standard, ``auto`` → auto; OpenAI API reference, "Create chat completion"); else the model's
``default_tier``. The OpenAI field reports the tier that served as ``priority`` (fast) or
``default`` (standard), so the official client sees values of its own vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.config import GatewayConfig, ModelConfig, TierChoice
from gateway.errors import InvalidRequest, ModelNotFound

SERVICE_TIER_TO_TIER: dict[str, TierChoice] = {
    "priority": "fast",
    "default": "standard",
    "flex": "standard",
    "scale": "standard",
    "auto": "auto",
}
TIER_TO_SERVICE_TIER: dict[str, str] = {"fast": "priority", "standard": "default"}
_HEADER_VALUES: frozenset[str] = frozenset({"standard", "fast", "auto"})


@dataclass(frozen=True, slots=True)
class TierRequest:
    """What the client asked for: ``model_name`` (the configured model, aliases resolved),
    ``tier`` (standard | fast | auto), and ``source`` (header | alias | service_tier | default)."""

    model_name: str
    model: ModelConfig
    tier: TierChoice
    source: str


class ModelIndex:
    """Lookup of client-facing names (models and aliases) built once from the config."""

    def __init__(self, config: GatewayConfig) -> None:
        self._by_name: dict[str, tuple[str, ModelConfig, TierChoice | None]] = {}
        for name, model in config.models.items():
            self._by_name[name] = (name, model, None)
            for alias, tier in model.aliases.items():
                self._by_name[alias] = (name, model, tier)

    def resolve(
        self,
        model_field: str,
        header_tier: str | None,
        service_tier: object,
        *,
        default_only: bool = False,
    ) -> TierRequest:
        """Resolve the body's ``model`` and the tier hints into a ``TierRequest``.

        ``default_only``: ignore every hint and use the model's default tier (a request that
        needs any replica of the model, e.g. token counting). Raises ``ModelNotFound`` (404) for
        an unknown model and ``InvalidRequest`` (400) for an invalid ``x-speedgate-tier`` header
        or ``service_tier`` value.
        """
        entry = self._by_name.get(model_field)
        if entry is None:
            raise ModelNotFound(
                f"The model `{model_field}` does not exist.", param="model"
            )
        name, model, alias_tier = entry
        if default_only:
            tier = model.default_tier if model.default_tier != "auto" else "standard"
            return TierRequest(name, model, tier, "default")
        if header_tier is not None:
            value = header_tier.strip().lower()
            if value not in _HEADER_VALUES:
                raise InvalidRequest(
                    f"x-speedgate-tier must be one of standard, fast, auto; got {header_tier!r}",
                    param="x-speedgate-tier",
                )
            return TierRequest(name, model, value, "header")  # type: ignore[arg-type]
        if alias_tier is not None:
            return TierRequest(name, model, alias_tier, "alias")
        if service_tier is not None:
            mapped = (
                SERVICE_TIER_TO_TIER.get(service_tier) if isinstance(service_tier, str) else None
            )
            if mapped is None:
                raise InvalidRequest(
                    "service_tier must be one of auto, default, flex, scale, priority",
                    param="service_tier",
                )
            return TierRequest(name, model, mapped, "service_tier")
        return TierRequest(name, model, model.default_tier, "default")

    def names(self) -> list[tuple[str, str, TierChoice | None]]:
        """``(client-facing name, model name, alias tier or None)`` for every name, sorted."""
        return sorted((k, v[0], v[2]) for k, v in self._by_name.items())
