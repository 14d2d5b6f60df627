"""Process-wide config sections: server, upstream client, health probes, state store, API keys
and limits."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    model_validator,
)

from gateway.config.base import TIERS, Tier, _Strict


class ServerConfig(_Strict):
    """The gateway's own HTTP server."""

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    workers: int = Field(1, ge=1, description="uvicorn worker processes; >1 without "
                         "state.redis_url keeps sessions, Responses and limits per process "
                         "(warned at start-up: config.advice)")
    max_body_bytes: int = Field(
        64 * 1024 * 1024,
        ge=1024,
        description="Largest accepted request body. A 1M-token conversation is ~4-8 MiB of JSON.",
    )
    graceful_shutdown_s: float = Field(
        60.0,
        ge=0,
        description="on SIGTERM, seconds open streams get to finish before they are ended with "
        "an in-band error (long agent streams: keep near the orchestrator's grace period)",
    )
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    access_log: bool = True
    max_header_bytes: int = Field(
        32 * 1024, ge=1024, description="Total size of the request headers; larger gets 431."
    )
    max_json_depth: int = Field(
        64, ge=4, description="Deepest nesting of arrays/objects in a request body; deeper: 400."
    )
    # Slow and idle clients (gateway.admit.connections). Defaults are Apache mod_reqtimeout's
    # (header=20, body=20, MinRate=500): a client gets that long, plus one second per 500 body
    # bytes received, before it is answered 408 and disconnected.
    header_timeout_s: float = Field(
        20.0, gt=0, description="connection accepted (or a new request begun) -> request headers "
        "complete; else 408 and the connection is closed (also bounds a client that sends nothing)",
    )
    body_timeout_s: float = Field(
        20.0, gt=0, description="headers complete -> body complete, extended by one second per "
        "body_min_rate_bytes_per_s bytes received; else 408 and the connection is closed",
    )
    body_min_rate_bytes_per_s: int = Field(
        500, ge=0, description="each this many body bytes extend body_timeout_s by a second "
        "(0: the body must arrive within body_timeout_s)",
    )
    max_connections: int = Field(
        10_000, ge=0, description="open client connections per worker process; one more is "
        "answered 503 and closed at once (0 = no cap; the soft file-descriptor limit is raised "
        "to fit when the hard limit allows)",
    )
    keepalive_timeout_s: float = Field(
        30.0, gt=0, description="an idle keep-alive connection is closed after this (uvicorn's "
        "timeout_keep_alive)",
    )


class UpstreamConfig(_Strict):
    """The HTTP client that talks to the engines."""

    max_connections: int = Field(
        0, ge=0, description="Total pooled connections to all replicas; 0 = unlimited."
    )
    # below the engines' own idle timeout (vLLM closes an idle connection after 5 s:
    # VLLM_HTTP_TIMEOUT_KEEP_ALIVE, uvicorn's timeout_keep_alive), so the gateway seldom sends
    # on a connection the engine is closing (``Upstream.post`` resends what one cuts)
    keepalive_timeout_s: float = Field(4.0, gt=0)


class HealthConfig(_Strict):
    """Active health probes of each replica's ``GET /health``."""

    enabled: bool = True
    interval_s: float = Field(5.0, gt=0)
    timeout_s: float = Field(2.0, gt=0)
    unhealthy_threshold: int = Field(2, ge=1, description="Failed probes in a row to mark down")
    healthy_threshold: int = Field(1, ge=1, description="Good probes in a row to mark up")


class StateConfig(_Strict):
    """Shared state across gateway replicas (usage totals). Without ``redis_url`` the state
    is in this process's memory."""

    redis_url: str | None = Field(
        None, description="redis://host:6379/0; None = in-memory state (single replica)"
    )
    redis_timeout_s: float = Field(
        0.1, gt=0, description="socket timeout of each Redis call; a slow Redis never stalls"
    )
    routing_key_prefix: str = Field(
        "speedgate:route:", description="prefix of the routing keys (sessions, prefix blocks)"
    )
    breaker_failures: int = Field(3, ge=1, description="Redis failures in a row to open")
    breaker_cooldown_s: float = Field(5.0, gt=0, description="open circuit: Redis skipped (s)")


class KeyLimits(_Strict):
    """Per-key limits, enforced across gateway replicas (``gateway.admit.ratelimit``); 0 = no limit.

    ``requests_per_min`` and ``tokens_per_min`` are token buckets refilled continuously
    (capacity = the limit, refill = limit / 60 s); tokens are prompt + completion tokens.
    ``concurrent`` caps the key's requests in flight."""

    requests_per_min: int = Field(0, ge=0)
    tokens_per_min: int = Field(0, ge=0)
    concurrent: int = Field(0, ge=0)


class ApiKeyConfig(_Strict):
    """One API key, stored only as a hash (``speedgate keygen`` prints a key and its hash).

    ``hash``: ``sha256:<64 hex>`` of the whole key string. ``models``: client-facing model
    names (configured models; aliases resolve to their model) or ``*``. ``tiers``: tiers the key
    may be served on. ``admin``: may read any key's ``/v1/usage``.

    Admission under load (``flow_control``): ``bands`` the priority bands the key may ask for
    (None = all), ``default_band`` its band when a request names none (None = the flow control
    default), ``weight`` its fair share within a band relative to other keys (tokens served in
    proportion while both wait). Session budgets (``budgets``, USD): ``session_budget_usd`` the
    budget of each of its sessions, ``max_session_budget_usd`` the cap of the
    ``x-speedgate-session-budget-usd`` header (None: the header may not exceed
    ``session_budget_usd``, or is uncapped when neither is set)."""

    id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:@\-]+$")
    hash: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    models: list[str] = Field(default_factory=lambda: ["*"])
    tiers: list[Tier] = Field(default_factory=lambda: list(TIERS), min_length=1)
    limits: KeyLimits = KeyLimits()
    admin: bool = False
    bands: list[str] | None = None
    default_band: str | None = None
    weight: float = Field(1.0, gt=0, le=1000)
    session_budget_usd: float | None = Field(None, gt=0)
    max_session_budget_usd: float | None = Field(None, gt=0)


class AuthConfig(_Strict):
    """API-key authentication (``Authorization: Bearer <key>``), see ``gateway.admit.auth``.

    ``enabled``: None (default) = on when ``keys`` or ``keys_file`` is set; true/false forces it
    (true with neither is a config error: every request would be refused). ``keys_file``: a
    YAML file ``{keys: [...]}`` of the same entries as ``keys`` (the Kubernetes Secret mounted
    at ``/etc/speedgate/secrets/api-keys.yaml``), read at startup and merged with ``keys``."""

    enabled: bool | None = None
    keys: list[ApiKeyConfig] = Field(default_factory=list)
    keys_file: str | None = None

    @model_validator(mode="after")
    def _check_some_key(self) -> AuthConfig:
        if self.enabled and not self.keys and self.keys_file is None:
            raise ValueError(
                "enabled is true but no API key is configured, so every request would be "
                "refused with 401: add one under auth.keys (`speedgate keygen` prints a key and "
                "its entry) or name a keys file in auth.keys_file, or set auth.enabled: false")
        return self

    @property
    def is_enabled(self) -> bool:
        """Whether requests must carry a valid key."""
        if self.enabled is not None:
            return self.enabled
        return bool(self.keys) or self.keys_file is not None


class RateLimitConfig(_Strict):
    """How per-key limits are kept (``gateway.admit.ratelimit``). With ``state.redis_url`` the
    counters are shared by all gateway replicas (atomic Lua check-and-reserve); else in memory.

    ``fail_mode``: when Redis cannot answer (timeout, breaker open), ``open`` keeps limiting on
    this replica's in-memory counters, ``closed`` refuses the request (503 + Retry-After).
    ``slot_ttl_s``: a concurrency slot left by a crashed gateway expires after this long."""

    fail_mode: Literal["open", "closed"] = "open"
    slot_ttl_s: float = Field(3600.0, gt=0)
    redis_prefix: str = "speedgate:rl:"


class ResponsesConfig(_Strict):
    """State of the Responses API (``/v1/responses``), owned by the gateway so engines stay
    stateless: each stored response (``store`` true, the API's default) keeps its turn's input
    items, its output and the response object, so ``previous_response_id`` can be expanded into
    the full conversation on any replica and ``GET``/``DELETE /v1/responses/{id}`` answered.
    With ``state.redis_url`` the records are in Redis (every gateway replica sees them), else in
    this process's memory (LRU)."""

    store_ttl_s: float = Field(
        86400.0,
        gt=0,
        description="seconds a stored response is kept after its last use; every "
        "previous_response_id lookup renews its whole chain",
    )
    max_response_bytes: int = Field(
        16 * 1024 * 1024,
        ge=1024,
        description="a response whose record (turn input + output + object) is larger is not "
        "stored (logged); a later previous_response_id naming it gets 404",
    )
    memory_max_responses: int = Field(
        10_000, ge=1, description="in-memory store only: responses kept (least recent evicted)"
    )
    memory_max_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1024,
        description="in-memory store only: total bytes of the stored records (least recent "
        "evicted); a record larger than this is not stored",
    )
    redis_prefix: str = "speedgate:resp:"
    redis_timeout_s: float = Field(
        1.0, gt=0, description="per-call Redis timeout of the response store (records are MiB)"
    )
