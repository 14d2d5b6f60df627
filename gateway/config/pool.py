"""One engine pool's config (timeouts, prices, retries, outlier ejection, discovery, routing) and
one model's (its pools, aliases, fallback chain, default tier, auto tier); units in names."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    AnyHttpUrl,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gateway.common.urls import redact_url
from gateway.config.base import Tier, TierChoice, _Strict


class Timeouts(_Strict):
    """Staged timeouts of one upstream attempt, in seconds (Envoy's vocabulary).

    ``connect_s``: TCP connect to a replica. ``ttft_s``: request sent → first data event
    (response headers do not count). ``stall_s``: longest gap between two events once the
    stream started (inter-token stall). ``total_s``: deadline for the whole request.

    ``keepalive_after_s``: a stream request still waiting for its first content event this
    long (a long prefill) is committed (status 200 and headers sent) and kept alive with a
    keep-alive every ``keepalive_interval_s`` in the API's own form, so that no hop with an
    idle timeout cuts it (60 s is a common load-balancer default); None: never committed
    early. The default (10 s) leaves a quick upstream 4xx/5xx, and the retries after it, its
    own status; once committed a final failure is one in-band error event.
    """

    connect_s: float = Field(5.0, gt=0)
    ttft_s: float = Field(300.0, gt=0)
    stall_s: float = Field(120.0, gt=0)
    total_s: float = Field(3600.0, gt=0)
    keepalive_after_s: float | None = Field(10.0, gt=0)
    keepalive_interval_s: float = Field(15.0, gt=0)


class Prices(_Strict):
    """Prices of one tier in USD per 1M tokens (the OpenAI pricing page's unit).

    Cached input tokens are part of ``prompt_tokens`` and billed at ``cached_input`` instead of
    ``input``: cost = (uncached × input + cached × cached_input + output × output) / 1e6.
    """

    input_per_mtok_usd: float = Field(0.0, ge=0)
    cached_input_per_mtok_usd: float = Field(0.0, ge=0)
    output_per_mtok_usd: float = Field(0.0, ge=0)
    flex_share: float = Field(
        0.5,
        ge=0,
        le=1,
        description="service_tier flex pays this share of every price (OpenAI prices flex at "
        "Batch API rates: 50%)",
    )


class RetryConfig(_Strict):
    """Retries within a pool, each on a different replica, only before anything reached the
    client. Backoff: full jitter (uniform(0, min(max, base × 2^n))). Budget: retries in the last
    ``budget_window_s`` ≤ ``budget_percent`` % of the pool's requests + ``budget_min_retries``
    (Envoy's retry budget)."""

    max_attempts: int = Field(3, ge=1, description="attempts per pool (first try included)")
    backoff_base_s: float = Field(0.025, ge=0)
    backoff_max_s: float = Field(1.0, ge=0)
    budget_percent: float = Field(20.0, ge=0, le=100)
    budget_min_retries: int = Field(3, ge=0)
    budget_window_s: float = Field(10.0, gt=0)
    max_retry_after_s: float = Field(
        2.0,
        ge=0,
        description="when every replica was tried, wait for a Retry-After up to this long "
        "(and within the deadline) and ask again; longer ones go back to the client",
    )


class ResumeConfig(_Strict):
    """Mid-stream resume (docs/resilience.md): a stream that breaks after content reached
    the client continues on another replica (same pool first, then along the fallback chain)
    from the text already relayed, spliced into the same client stream. ``enabled`` false: a
    break of this pool's stream ends with one in-band error event, and this pool never
    continues another pool's stream either."""

    enabled: bool = True
    max_resumes: int = Field(
        2, ge=0, description="continuations per request; a stream broken more often ends "
        "with one in-band error event"
    )


class OutlierConfig(_Strict):
    """Passive outlier ejection (Envoy's ``outlier_detection``): see
    ``gateway.fleet.outlier``."""

    enabled: bool = True
    consecutive_failures: int = Field(5, ge=1, description="Envoy's consecutive_5xx default")
    base_ejection_s: float = Field(30.0, gt=0, description="Envoy's base_ejection_time default")
    max_ejection_s: float = Field(300.0, gt=0)
    max_ejection_percent: float = Field(50.0, ge=0, le=100)
    probation_successes: int = Field(3, ge=1)


class DnsDiscoveryConfig(_Strict):
    """Replicas discovered by DNS: one replica per address ``host`` resolves to (a Kubernetes
    headless Service, a compose alias), re-resolved every ``interval_s``; see
    ``gateway.upstream.discovery``."""

    host: str = Field(min_length=1)
    port: int = Field(ge=1, le=65535)
    scheme: Literal["http", "https"] = "http"
    interval_s: float = Field(5.0, gt=0)
    timeout_s: float = Field(2.0, gt=0)
    family: Literal["auto", "ipv4", "ipv6", "any"] = "auto"


RoutingWeights = dict[Literal["prefix", "session", "load", "hash", "headroom"], float]


def _default_weights() -> RoutingWeights:
    return {"prefix": 3.0, "session": 2.0, "load": 1.0, "hash": 0.25, "headroom": 1.0}


class RoutingConfig(_Strict):
    """Replica choice within a pool (see ``gateway.routing``).

    ``policy``: ``pipeline`` (filters → weighted scorers → picker) or ``round_robin`` (a
    baseline). ``weights``: scorer name → weight (a missing scorer is off); every scorer scores
    in [0, 1]. ``bounded_load_c``: consistent hashing with bounded loads (Mirrokni, Thorup,
    Zadimoghaddam 2018): when a session is bound (first turn, or rebound) no replica is picked
    that would then hold more than ``ceil(c × mean)`` active sessions; with policies that keep
    no session state (no ``prefix``/``session`` weight, or the store down) the bound applies to
    requests instead, never below ``bounded_load_min``; 0 = off. ``session_idle_s``: a session
    counts as active on its replica this long after its last request. ``overload_c`` and
    ``overload_min``: a bound session stays on its replica unless that replica's request load
    exceeds ``max(overload_min, overload_c × mean)`` (then it is rebound; 0 = never).
    ``chunk_chars``: characters per prefix block (~4 chars per token, so 2048 ≈ 512 tokens
    ≈ 32 vLLM blocks). ``max_hash_chars``: conversation characters hashed at most (the rest
    only shares its replica). ``table_*``: the in-memory block-hash → replica table, bounded by
    entries (~230 bytes each) and by bytes (the session table and the active-session ledger get
    a quarter of each), and the TTL (s) of every binding, in memory or Redis.
    ``load_scrape_interval_s``: how often each replica's ``/metrics`` is read (0 = never).
    """

    policy: Literal["pipeline", "round_robin"] = "pipeline"
    weights: RoutingWeights = Field(default_factory=_default_weights)
    bounded_load_c: float = Field(1.25, ge=0)
    bounded_load_min: int = Field(4, ge=1)
    session_idle_s: float = Field(120.0, gt=0)
    overload_c: float = Field(2.0, ge=0)
    overload_min: int = Field(16, ge=1)
    chunk_chars: int = Field(2048, ge=64)
    max_hash_chars: int = Field(16 * 1024 * 1024, ge=1024)
    table_max_entries: int = Field(200_000, ge=16)
    table_max_bytes: int = Field(64 * 1024 * 1024, ge=64 * 1024)
    table_ttl_s: float = Field(3600.0, gt=0)
    load_scrape_interval_s: float = Field(1.0, ge=0)

    @field_validator("weights")
    @classmethod
    def _non_negative(cls, v: RoutingWeights) -> RoutingWeights:
        if any(w < 0 for w in v.values()):
            raise ValueError("weights must be >= 0")
        return v


class PoolConfig(_Strict):
    """One engine pool: the replicas serving one model at one tier, listed in ``endpoints``
    or found by ``discovery`` (exactly one of the two)."""

    discovery: DnsDiscoveryConfig | None = None
    endpoints: list[AnyHttpUrl] = Field(default_factory=list, validate_default=True)
    served_model_name: str = Field(min_length=1)
    timeouts: Timeouts = Timeouts()
    retry: RetryConfig = RetryConfig()
    resume: ResumeConfig = ResumeConfig()
    outlier: OutlierConfig = OutlierConfig()
    prices: Prices = Prices()
    max_inflight_per_replica: int = Field(
        0,
        ge=0,
        description="Replicas at this many in-flight requests are skipped; 0 = no cap. With "
        "flow control, a pool whose every slot is taken queues requests in the gateway.",
    )
    max_engine_waiting: int | None = Field(
        None,
        ge=0,
        description="flow control: the pool is saturated while its replicas' scraped "
        "vllm:num_requests_waiting exceeds this many per replica (None = not used)",
    )
    scheduling_policy: Literal["fcfs", "priority"] = Field(
        "fcfs",
        description="the engines' --scheduling-policy; with priority the gateway sends each "
        "request's band as vLLM's `priority` field (0 = highest band; lower runs earlier)",
    )
    routing: RoutingConfig = RoutingConfig()

    @field_validator("endpoints")
    @classmethod
    def _unique_endpoints(cls, v: list[AnyHttpUrl], info: ValidationInfo) -> list[AnyHttpUrl]:
        has_discovery = info.data.get("discovery") is not None
        if not v and not has_discovery:
            raise ValueError("at least one endpoint URL is required (or set discovery)")
        if v and has_discovery:
            raise ValueError("set endpoints or discovery, not both")
        for u in v:
            if u.query or u.fragment:
                raise ValueError(f"{redact_url(str(u))}: a base URL takes no query or fragment")
            if (u.path or "").rstrip("/").endswith("/v1"):
                raise ValueError(
                    f"{redact_url(str(u))}: give the engine's base URL without /v1 "
                    "(the gateway appends /v1/chat/completions)"
                )
        urls = [str(u).rstrip("/") for u in v]
        if len(set(urls)) != len(urls):
            raise ValueError("duplicate endpoint URL in pool")
        return v

    def endpoint_urls(self) -> list[str]:
        """Endpoint base URLs without trailing slash, e.g. ``http://10.0.0.5:8000``."""
        return [str(u).rstrip("/") for u in self.endpoints]


class AutoConfig(_Strict):
    """The ``auto`` tier's policy (``gateway.plan.auto``): standard or fast per request, from live
    estimates of each pool. ``half_life_s``: measurements of finished requests lose half their
    weight every this many seconds. ``explore_share``: share of new sessions sent to the pool
    that would lose, while that pool has had no measurement for ``explore_stale_s`` seconds
    (keeps an unused pool's estimate fresh; at the latest every ``ceil(1 / explore_share)``-th
    such session, and a measurement after that long a silence outweighs the stale fit).
    ``switch_margin``: a session leaves the pool its last turn used only when the other is
    faster by more than this fraction (the re-prefill of its conversation is already counted).
    ``min_samples``: measured requests a pool needs before its estimate is used (until then:
    fast while below ``auto_fast_max_inflight_per_replica``).
    ``session_table_entries``/``session_table_max_bytes``/``session_ttl_s``: the session → tier
    table (LRU + TTL, bounded by entries and by bytes).
    ``acceptance_scrape_interval_s``: how often the fast pool's ``vllm:spec_decode_*`` counters
    (scraped with the engine load, ``routing.load_scrape_interval_s``) become the acceptance
    estimate (0 = never). ``seed``: the exploration RNG's seed (None = random)."""

    half_life_s: float = Field(30.0, gt=0)
    explore_share: float = Field(0.05, ge=0, le=1)
    explore_stale_s: float = Field(10.0, ge=0)
    switch_margin: float = Field(0.15, ge=0, lt=1)
    min_samples: int = Field(3, ge=1)
    session_table_entries: int = Field(100_000, ge=16)
    session_table_max_bytes: int = Field(32 * 1024 * 1024, ge=64 * 1024)
    session_ttl_s: float = Field(3600.0, gt=0)
    acceptance_scrape_interval_s: float = Field(2.0, ge=0)
    seed: int | None = None


class ModelConfig(_Strict):
    """A client-facing model name and its tiers, aliases and fallback chain.

    ``fallback`` maps a tier to the tier tried next when its pool cannot serve (e.g.
    ``{fast: standard}``); chains may not revisit a tier. ``aliases`` maps extra client-facing
    names to a tier (``mymodel-fast: fast``).
    """

    tiers: dict[Tier, PoolConfig] = Field(min_length=1)
    default_tier: TierChoice = "standard"
    aliases: dict[str, TierChoice] = Field(default_factory=dict)
    fallback: dict[Tier, Tier] = Field(default_factory=dict)
    auto_fast_max_inflight_per_replica: float = Field(
        4.0,
        gt=0,
        description="auto picks the fast pool while its mean in-flight per replica is below this",
    )
    auto: AutoConfig = AutoConfig()
    output_cap_overflow: Literal["lower", "refuse"] = Field(
        "lower",
        description="an OpenAI-shaped request (chat, completions, Responses) whose prompt fits "
        "but prompt + output cap does not: lower (sent without its cap, so the engine writes "
        "up to its context; header x-speedgate-output-cap) or refuse (400 "
        "context_length_exceeded naming the cap). The Messages API always refuses.",
    )

    @model_validator(mode="after")
    def _check_tiers(self) -> ModelConfig:
        if self.default_tier != "auto" and self.default_tier not in self.tiers:
            raise ValueError(f"default_tier {self.default_tier!r} has no pool in tiers")
        for alias, tier in self.aliases.items():
            if tier != "auto" and tier not in self.tiers:
                raise ValueError(f"aliases.{alias}: tier {tier!r} has no pool in tiers")
        for src, dst in self.fallback.items():
            if src not in self.tiers or dst not in self.tiers:
                raise ValueError(f"fallback.{src}: tiers {src!r} and {dst!r} must both have pools")
        for start in self.fallback:
            seen = [start]
            nxt = self.fallback.get(start)
            while nxt is not None:
                if nxt in seen:
                    chain = " -> ".join([*seen, nxt])
                    raise ValueError(f"fallback: cyclic chain {chain}")
                seen.append(nxt)
                nxt = self.fallback.get(nxt)
        return self

    def fallback_chain(self, tier: Tier) -> list[Tier]:
        """Tiers to try in order, starting with ``tier``; each at most once."""
        chain = [tier]
        nxt = self.fallback.get(tier)
        while nxt is not None and nxt not in chain:
            chain.append(nxt)
            nxt = self.fallback.get(nxt)
        return chain
