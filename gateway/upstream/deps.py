"""What the steps below the handler (failover, continuation, the relays) read from the gateway's
runtime state: declared here as a protocol so that they need not import ``gateway.state``, which
sits above them (it holds admission, the console and the health probes too).
``gateway.state.GatewayState`` satisfies it structurally.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gateway.config import GatewayConfig
    from gateway.telemetry.metrics import GatewayMetrics
    from gateway.upstream.transport import UpstreamClient


class StepDeps(Protocol):
    """The gateway's config, its upstream client and its metrics (read-only)."""

    @property
    def config(self) -> GatewayConfig:
        """The gateway's whole config."""
        ...

    @property
    def upstream(self) -> UpstreamClient:
        """The shared upstream HTTP client (one connection pool per process)."""
        ...

    @property
    def metrics(self) -> GatewayMetrics:
        """The gateway's Prometheus metrics."""
        ...
