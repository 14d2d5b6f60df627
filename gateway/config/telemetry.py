"""The ``telemetry:`` section: OTLP export, trace sampling, usage estimation, access log format."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
)


class TelemetryConfig(BaseModel):
    """Telemetry settings (the ``telemetry:`` section of the gateway config)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    service_name: str = Field("speedgate", min_length=1, description="OTel service.name")
    otlp_endpoint: str | None = Field(
        None,
        description="OTLP/HTTP collector base URL (http://host:4318); None: the standard "
        "OTEL_EXPORTER_OTLP_* environment variables, else no export",
    )
    traces: bool = Field(
        True, description="Record a span per request and per attempt (when an exporter is set)"
    )
    trace_sample_ratio: float = Field(
        1.0, ge=0, le=1, description="Share of new traces recorded (a client's choice is kept)"
    )
    otlp_metrics_interval_s: float = Field(30.0, gt=0, description="OTLP metrics export period")
    otlp_timeout_s: float = Field(5.0, gt=0, description="Timeout of one OTLP export")
    genai_provider_name: str = Field(
        "speedgate", min_length=1, description="gen_ai.provider.name on OTLP GenAI metrics"
    )
    usage_estimate_encoding: Literal["cl100k_base", "o200k_base"] = Field(
        "cl100k_base", description="tiktoken encoding for usage the engine did not report"
    )
    token_count_cache_entries: int = Field(
        131_072, ge=1, description="Prefix blocks whose token counts are cached (LRU; ~200 "
        "bytes each: the default is ~26 MB, 64 sessions of 1M tokens)",
    )
    token_count_block_chars: int = Field(
        2048, ge=64, description="Characters per prefix block of the token-count cache"
    )
    access_log_format: Literal["text", "json"] = "text"

    @field_validator("otlp_endpoint")
    @classmethod
    def _http_url(cls, v: str | None) -> str | None:
        if v is None:
            return None
        if urlsplit(v).scheme not in ("http", "https") or not urlsplit(v).netloc:
            raise ValueError("otlp_endpoint must be an http(s) URL such as http://host:4318")
        return v.rstrip("/")
