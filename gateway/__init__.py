"""speedgate: an OpenAI-compatible inference gateway with speed tiers.

Public surface: ``create_app`` (the ASGI app), ``load_config`` / ``GatewayConfig`` (the config
schema) and the ``speedgate`` command (``gateway.cli``).
"""

from importlib.metadata import PackageNotFoundError, version

from gateway.config import ConfigError, GatewayConfig, load_config

try:
    __version__ = version("speedgate")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["ConfigError", "GatewayConfig", "__version__", "create_app", "load_config"]


def create_app(config: GatewayConfig):
    """Build the gateway ASGI app for ``config`` (see ``gateway.app.create_app``)."""
    from gateway.app import create_app as _create

    return _create(config)
