"""``GatewayConfig`` (the whole schema) and ``load_config``: YAML file + ``SPEEDGATE_*`` environment
overrides, validated; errors name the field."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    Field,
    ValidationError,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from gateway.config.console import ConsoleConfig
from gateway.config.flow import BudgetConfig, FlowControlConfig, check_key_bands
from gateway.config.pool import ModelConfig
from gateway.config.problems import report
from gateway.config.process import (
    AuthConfig,
    HealthConfig,
    RateLimitConfig,
    ResponsesConfig,
    ServerConfig,
    StateConfig,
    UpstreamConfig,
)
from gateway.config.telemetry import TelemetryConfig


class GatewayConfig(BaseSettings):
    """The whole gateway configuration (YAML file + ``SPEEDGATE_`` environment overrides)."""

    model_config = SettingsConfigDict(
        env_prefix="SPEEDGATE_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    server: ServerConfig = ServerConfig()
    upstream: UpstreamConfig = UpstreamConfig()
    health: HealthConfig = HealthConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    state: StateConfig = StateConfig()
    auth: AuthConfig = AuthConfig()
    rate_limits: RateLimitConfig = RateLimitConfig()
    console: ConsoleConfig = ConsoleConfig()
    flow_control: FlowControlConfig = FlowControlConfig()
    budgets: BudgetConfig = BudgetConfig()
    responses: ResponsesConfig = ResponsesConfig()
    models: dict[str, ModelConfig] = Field(min_length=1)

    @model_validator(mode="after")
    def _check_names(self) -> GatewayConfig:
        names: dict[str, str] = {}
        for model_name, model in self.models.items():
            for name in (model_name, *model.aliases):
                if name in names:
                    raise ValueError(
                        f"models.{model_name}: name {name!r} already used by {names[name]!r}"
                    )
                names[name] = model_name
        check_key_bands(self.flow_control, self.auth.keys, "auth.keys")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Environment first: SPEEDGATE_* overrides what the YAML file (init kwargs) says.
        return (env_settings, init_settings)


class ConfigError(Exception):
    """Raised when a config file cannot be read or does not validate; message names the field."""


def load_config(path: str | os.PathLike[str] | None = None, **overrides: Any) -> GatewayConfig:
    """Load and validate the config from a YAML file (plus env overrides and ``overrides``).

    Raises ``ConfigError`` naming every offending field (``models.m.tiers.fast.endpoints:
    ...``) and every failed cross-field check at once (``gateway.config.problems``).
    """
    data: dict[str, Any] = {}
    if path is not None:
        try:
            raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except OSError as e:
            raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
        except UnicodeDecodeError as e:
            raise ConfigError(f"config file {path} is not UTF-8 text (byte {e.start}: "
                              f"{e.reason})") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise ConfigError(f"config file {path}: top level must be a mapping")
        odd = [k for k in raw if not isinstance(k, str)]
        if odd:  # YAML keys such as 1, 1.5 or null: not the name of any section
            raise ConfigError(f"config file {path}: top-level keys must be section names, "
                              f"not {odd[0]!r}")
        data = raw
    data.update(overrides)
    try:
        return GatewayConfig(**data)
    except ValidationError as e:
        raise ConfigError(report(GatewayConfig, data, e)) from None
