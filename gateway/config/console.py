"""The ``console:`` section: the live console page and its JSON (``gateway.console``)."""

from __future__ import annotations

from pydantic import Field, model_validator

from gateway.config.base import _Strict


class ConsoleConfig(_Strict):
    """The built-in console (``GET /console``, ``GET /v1/console/state``).

    ``window_s``: how far back the live figures reach (TTFT and output-speed percentiles, cost
    rate, retries, auto decisions), kept as ``window_s / step_s`` buckets of ``step_s`` seconds
    (one chart point each; at most 720 buckets). ``refresh_s``: how often the page polls the
    JSON. ``max_sessions``: sessions remembered (least recently seen dropped first);
    ``top_sessions``: rows in each sessions table; ``recent_events``: retries, fallbacks and
    timeouts listed one by one (older ones still count in the window's totals)."""

    enabled: bool = Field(True, description="serve /console and /v1/console/state")
    window_s: float = Field(300.0, ge=10.0, le=3600.0)
    step_s: float = Field(5.0, ge=1.0, le=60.0)
    refresh_s: float = Field(2.0, ge=0.5, le=60.0)
    max_sessions: int = Field(10_000, ge=10, le=1_000_000)
    top_sessions: int = Field(10, ge=1, le=100)
    recent_events: int = Field(50, ge=1, le=1000)

    @model_validator(mode="after")
    def _check_buckets(self) -> ConsoleConfig:
        if self.step_s > self.window_s / 2:
            raise ValueError("console.step_s must be at most half of console.window_s")
        if self.window_s / self.step_s > 720:
            raise ValueError("console.window_s / console.step_s must be at most 720 buckets")
        return self
