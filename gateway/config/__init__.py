"""The one typed configuration schema of the gateway, loaded from YAML with env overrides.

Every default and unit lives here. A config file is YAML shaped like ``GatewayConfig``;
environment variables ``SPEEDGATE_<FIELD>`` override it, nested fields joined by ``__``
(``SPEEDGATE_SERVER__PORT=9000``, ``SPEEDGATE_SERVER__MAX_BODY_BYTES=1048576``). Unknown keys,
empty pools, bad URLs, unknown tiers and cyclic fallback chains fail at load with a
``ConfigError`` whose message names the field (pydantic's ``loc``).

The schema is split by scope (``base``: tier names; ``pool``: an engine pool and a model;
``process``: process-wide sections; ``telemetry``; ``console``; ``flow``: flow control and
session budgets; ``load``: the whole ``GatewayConfig`` and ``load_config``); callers import every
model from ``gateway.config``. No config model is defined outside this package.
"""

from gateway.config.base import (
    TIERS,
    Tier,
    TierChoice,
)
from gateway.config.console import (
    ConsoleConfig,
)
from gateway.config.flow import (
    BandConfig,
    BudgetConfig,
    FlowControlConfig,
    check_key_bands,
)
from gateway.config.load import (
    ConfigError,
    GatewayConfig,
    load_config,
)
from gateway.config.pool import (
    AutoConfig,
    DnsDiscoveryConfig,
    ModelConfig,
    OutlierConfig,
    PoolConfig,
    Prices,
    ResumeConfig,
    RetryConfig,
    RoutingConfig,
    RoutingWeights,
    Timeouts,
)
from gateway.config.process import (
    ApiKeyConfig,
    AuthConfig,
    HealthConfig,
    KeyLimits,
    RateLimitConfig,
    ResponsesConfig,
    ServerConfig,
    StateConfig,
    UpstreamConfig,
)
from gateway.config.telemetry import (
    TelemetryConfig,
)

__all__ = [
    "TIERS",
    "ApiKeyConfig",
    "AuthConfig",
    "AutoConfig",
    "BandConfig",
    "BudgetConfig",
    "ConfigError",
    "ConsoleConfig",
    "DnsDiscoveryConfig",
    "FlowControlConfig",
    "GatewayConfig",
    "HealthConfig",
    "KeyLimits",
    "ModelConfig",
    "OutlierConfig",
    "PoolConfig",
    "Prices",
    "RateLimitConfig",
    "ResponsesConfig",
    "ResumeConfig",
    "RetryConfig",
    "RoutingConfig",
    "RoutingWeights",
    "ServerConfig",
    "StateConfig",
    "TelemetryConfig",
    "Tier",
    "TierChoice",
    "Timeouts",
    "UpstreamConfig",
    "check_key_bands",
    "load_config",
]
