"""Engine pools and their replicas: the live state the router reads (health, in-flight)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from gateway.common.urls import redact_url
from gateway.config import GatewayConfig, PoolConfig, Tier
from gateway.fleet.outlier import OutlierState, max_ejected, record_failure, record_success
from gateway.fleet.rates import PoolRates
from gateway.fleet.retry_budget import RetryBudget

if TYPE_CHECKING:
    from collections import Counter
    from collections.abc import Collection, Sequence

    from gateway.routing.keys import RouteRequest
    from gateway.routing.store import RoutingStore

log = logging.getLogger("speedgate.pools")


@dataclass(slots=True, eq=False)
class Replica:
    """One engine server. ``url`` is its base URL (may carry credentials: log ``safe_url``).

    ``inflight`` counts requests this gateway has open to it (incremented when an attempt
    starts, decremented on every exit path). ``healthy`` comes from active ``/health`` probes,
    ``outlier`` from passive ejection (``gateway.fleet.outlier``).
    """

    url: str
    pool_key: str
    inflight: int = 0
    healthy: bool = True
    consecutive_probe_failures: int = 0
    consecutive_probe_successes: int = 0
    safe_url: str = ""
    name: str = ""  # "model/tier/index": how clients and logs name it without its address
    outlier: OutlierState = field(default_factory=OutlierState)
    # engine load from its /metrics (gateway.upstream.load_scraper); engine_load_at: monotonic s
    engine_running: int = 0
    engine_waiting: int = 0
    kv_cache_usage: float = 0.0
    spec_drafts: float = 0.0  # vllm:spec_decode_num_drafts, cumulative
    spec_accepted: float = 0.0  # vllm:spec_decode_num_accepted_tokens, cumulative
    spec_draft_tokens: float = 0.0  # vllm:spec_decode_num_draft_tokens, cumulative
    prefix_queries: float = 0.0  # vllm:prefix_cache_queries (prompt tokens), cumulative
    prefix_hits: float = 0.0  # vllm:prefix_cache_hits (prompt tokens), cumulative
    engine_load_at: float = 0.0
    # KV capacity the engine reports (gateway.upstream.load_scraper): vllm:cache_config_info labels,
    # vllm:num_preemptions (cumulative) and max_model_len from its /v1/models; 0 = unknown
    kv_num_blocks: int = 0
    kv_block_size: int = 0
    kv_cache_dtype: str = ""
    engine_preemptions: float = 0.0
    max_model_len: int = 0
    # tokens (prompt + output cap) of this gateway's attempts open on it: what they hold or
    # will still grow into (gateway.routing.fit.free_kv_tokens)
    inflight_kv_tokens: int = 0
    #: this gateway's open attempts here: id → (KV tokens, output cap tokens, start s monotonic)
    open_kv: dict[int, tuple[int, int, float]] = field(default_factory=dict)

    @property
    def kv_tokens(self) -> int:
        """Tokens the replica's KV pool holds (``num_gpu_blocks × block_size``); 0 = unknown."""
        return self.kv_num_blocks * self.kv_block_size

    def __post_init__(self) -> None:
        self.safe_url = redact_url(self.url)


def replica_load(r: Replica, now: float, fresh_s: float = 3.0) -> int:
    """Requests on ``r``: max(in-flight here, engine running + waiting if scraped within
    ``fresh_s`` seconds; the engine's figures come from ``gateway.upstream.load_scraper``).

    The engine's ``num_requests_running + num_requests_waiting`` also counts other gateway
    replicas' requests. The load decides whether a replica is ``overloaded`` (the only reason a
    bound session leaves it), feeds the load scorer, and is what the bounded-load rule bounds for
    policies without session state; sessions being bound are bounded by active sessions instead
    (``gateway.routing.session_ledger``). Units: requests."""
    if r.engine_load_at and now - r.engine_load_at <= fresh_s:
        return max(r.inflight, r.engine_running + r.engine_waiting)
    return r.inflight


class ReplicaRouter(Protocol):
    """What a pool's router offers (``gateway.routing.pipeline.PoolRouter`` implements it):
    declared here so the pool, which the pipeline imports, need not import the pipeline."""

    store: RoutingStore
    decisions: Counter[str]

    async def pick(
        self,
        route: RouteRequest | None,
        candidates: Sequence[Replica],
        exclude: Collection[Replica] = (),
    ) -> Replica | None:
        """The replica for the next attempt among ``candidates`` (none of ``exclude``)."""
        ...

    async def drain(self) -> None:
        """Wait for the router's pending state-store writes."""
        ...

    async def forget(self, session: str, shared: bool = True) -> None:
        """Release an ended session's routing state (its routing key); the shared (Redis)
        state too when ``shared``."""
        ...


@dataclass(slots=True, eq=False)
class Pool:
    """The replicas serving one model at one tier (``key`` is ``model/tier``)."""

    model: str
    tier: Tier
    config: PoolConfig
    replicas: list[Replica] = field(default_factory=list)
    budget: RetryBudget = field(init=False)
    rates: PoolRates = field(default_factory=PoolRates)  # measured prefill/decode tokens/s
    router: ReplicaRouter | None = None  # set by gateway.routing.service at startup
    # tasks waiting for a slot of this pool to free (``wait_for_slot``), woken by ``release``
    slot_waiters: set[asyncio.Future[None]] = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        self.budget = RetryBudget(self.config.retry)

    @property
    def key(self) -> str:
        """``model/tier``, the pool's name in logs and metrics."""
        return f"{self.model}/{self.tier}"

    def set_endpoints(self, urls: list[str]) -> None:
        """Replace the replica list (DNS discovery): replicas whose URL stays keep their state
        (in-flight, health, ejection); new URLs join healthy; gone ones leave (requests in
        flight on them still hold their own reference)."""
        by_url = {r.url: r for r in self.replicas}
        self.replicas = [
            by_url.get(u) or Replica(u, self.key, name=f"{self.key}/{_short_hash(u)}")
            for u in urls
        ]

    def usable(self, now: float) -> list[Replica]:
        """Replicas that are healthy, not ejected at ``now`` (monotonic s) and below the pool's
        ``max_inflight_per_replica`` cap (0 = no cap)."""
        cap = self.config.max_inflight_per_replica
        return [
            r
            for r in self.replicas
            if r.healthy
            and not r.outlier.is_ejected(now)
            and (cap == 0 or r.inflight < cap)
        ]

    def release(self, replica: Replica, kv_tokens: int = 0, attempt_id: int = 0) -> None:
        """Give back the in-flight slot an attempt held on ``replica`` (one of this pool's):
        ``inflight`` decremented (and ``inflight_kv_tokens`` by the attempt's ``kv_tokens``,
        its ``open_kv`` entry ``attempt_id`` dropped), and every ``wait_for_slot`` waiter
        woken."""
        replica.inflight -= 1
        replica.inflight_kv_tokens -= kv_tokens
        replica.open_kv.pop(attempt_id, None)
        for waiter in self.slot_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self.slot_waiters.clear()

    def record_success(self, replica: Replica) -> None:
        """Feed a successful attempt to outlier detection."""
        record_success(replica.outlier, self.config.outlier)

    def record_failure(self, replica: Replica, now: float) -> bool:
        """Feed a failed attempt (connect error, 5xx, timeout, broken stream) to outlier
        detection; True when it ejected the replica."""
        cfg = self.config.outlier
        if not cfg.enabled:
            return False
        ejected_now = sum(r.outlier.is_ejected(now) for r in self.replicas)
        may_eject = ejected_now < max_ejected(len(self.replicas), cfg)
        if record_failure(replica.outlier, cfg, now, may_eject):
            log.warning(
                "replica %s (%s) ejected for %.0fs after repeated failures",
                replica.safe_url,
                self.key,
                replica.outlier.ejected_until - now,
            )
            return True
        return False

    def has_healthy(self) -> bool:
        """True when at least one replica passes its health probes."""
        return any(r.healthy for r in self.replicas)


class PoolRegistry:
    """All pools, keyed by ``(model, tier)``, built once from the config."""

    def __init__(self, config: GatewayConfig) -> None:
        self._pools: dict[tuple[str, str], Pool] = {}
        for name, model in config.models.items():
            for tier, pc in model.tiers.items():
                pool = Pool(name, tier, pc)
                pool.replicas = [
                    Replica(u, pool.key, name=f"{pool.key}/{i}")
                    for i, u in enumerate(pc.endpoint_urls())
                ]
                self._pools[(name, tier)] = pool

    def get(self, model: str, tier: str) -> Pool | None:
        """The pool of ``model`` at ``tier``, or None when that tier is not configured."""
        return self._pools.get((model, tier))

    def all(self) -> list[Pool]:
        """Every pool, in config order."""
        return list(self._pools.values())

    def replicas(self) -> list[Replica]:
        """Every replica of every pool."""
        return [r for p in self._pools.values() for r in p.replicas]


def _short_hash(url: str) -> str:
    """A stable 8-hex-digit name for a discovered replica (its address is not for clients)."""
    return hashlib.sha256(url.encode()).hexdigest()[:8]


async def wait_for_slot(pools: Sequence[Pool], timeout_s: float) -> bool:
    """Wait until an attempt releases an in-flight slot in any of ``pools`` (``Pool.release``)
    or ``timeout_s`` seconds pass, whichever is first; True when a slot was released. No
    polling: one future, registered with each pool and woken by the release. The timeout also
    bounds how late a replica that became usable otherwise (health probe, ejection over) is
    seen by the caller, who looks again either way."""
    if timeout_s <= 0:
        return False
    waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    for pool in pools:
        pool.slot_waiters.add(waiter)
    try:
        await asyncio.wait_for(asyncio.shield(waiter), timeout_s)
        return True
    except TimeoutError:
        return False
    finally:
        for pool in pools:
            pool.slot_waiters.discard(waiter)
        if not waiter.done():
            waiter.cancel()
