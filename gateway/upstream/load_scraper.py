"""The engine load scraper: each replica's queue and KV-cache usage read from its ``/metrics``
(vLLM's metric names) and stored on the replica (``gateway.fleet.pools.Replica``).

What the scraped values mean for routing: ``gateway.fleet.pools.replica_load``. Units:
requests; KV usage 0..1.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from prometheus_client.parser import text_string_to_metric_families

from gateway.common.tasks import cancel_and_wait
from gateway.fleet.pools import PoolRegistry, Replica
from gateway.upstream.client import Upstream, UpstreamConnectError

log = logging.getLogger("speedgate.routing")

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
SPEC_DRAFTS = "vllm:spec_decode_num_drafts"  # counters (samples end in _total)
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
PREFIX_QUERIES = "vllm:prefix_cache_queries"  # counters of prompt tokens (the console's hit rate)
PREFIX_HITS = "vllm:prefix_cache_hits"
PREEMPTIONS = "vllm:num_preemptions"  # counter: requests preempted (recompute) by the engine
CACHE_INFO = "vllm:cache_config_info"  # info gauge: labels num_gpu_blocks, block_size, cache_dtype
KV_BLOCKS = "num_gpu_blocks"  # keys of parse_engine_metrics for the info gauge's labels
KV_BLOCK_SIZE = "block_size"
# sample name -> value name (counter samples carry _total; matched by sample, so an exposition
# without # TYPE lines parses too)
_SAMPLES = {RUNNING: RUNNING, WAITING: WAITING, KV_USAGE: KV_USAGE,
            **{c + "_total": c for c in (SPEC_DRAFTS, SPEC_ACCEPTED, SPEC_DRAFT_TOKENS,
                                         PREFIX_QUERIES, PREFIX_HITS, PREEMPTIONS)}}


def parse_engine_metrics(text: str, info: dict[str, str] | None = None) -> dict[str, float]:
    """Sum of the samples of running, waiting, KV usage (max for usage), the speculative
    decoding counters (drafts, draft tokens, accepted tokens), the prefix-cache counters
    (queried and hit prompt tokens) and preemptions in a Prometheus text exposition; metrics
    that are missing are absent from the result. ``vllm:cache_config_info`` (vLLM
    ``loggers.py`` ``log_metrics_info``: the cache config as labels) gives ``num_gpu_blocks``
    and ``block_size`` (keys ``KV_BLOCKS``, ``KV_BLOCK_SIZE``, summed over engines, block size
    the largest) and, into ``info`` when given, its labels as strings."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        if not fam.name.startswith("vllm:"):
            continue
        for s in fam.samples:
            if s.name.startswith(CACHE_INFO):
                _cache_info(s.labels, out, info)
                continue
            name = _SAMPLES.get(s.name)
            if name is None:
                continue
            if name == KV_USAGE:
                out[KV_USAGE] = max(out.get(KV_USAGE, 0.0), s.value)
            else:
                out[name] = out.get(name, 0.0) + s.value
    return out


def _cache_info(labels: dict[str, str], out: dict[str, float], info: dict[str, str] | None
                ) -> None:
    try:
        blocks = int(labels.get(KV_BLOCKS) or 0)
        size = int(labels.get(KV_BLOCK_SIZE) or 0)
    except ValueError:  # "None" before the engine sized its pool
        return
    out[KV_BLOCKS] = out.get(KV_BLOCKS, 0.0) + blocks
    out[KV_BLOCK_SIZE] = max(out.get(KV_BLOCK_SIZE, 0.0), float(size))
    if info is not None:
        info.update(labels)


def parse_max_model_len(doc: object) -> int:
    """``max_model_len`` of the first model in a ``/v1/models`` answer (vLLM's ``ModelCard``
    carries it); 0 when absent."""
    data = doc.get("data") if isinstance(doc, dict) else None
    if isinstance(data, list):
        for m in data:
            n = m.get("max_model_len") if isinstance(m, dict) else None
            if isinstance(n, int) and not isinstance(n, bool) and n > 0:
                return n
    return 0


def apply_engine_metrics(replica: Replica, values: dict[str, float], now: float) -> None:
    """Store scraped values on ``replica`` (missing ones count as 0) at ``now`` (monotonic s)."""
    replica.engine_running = int(values.get(RUNNING, 0))
    replica.engine_waiting = int(values.get(WAITING, 0))
    replica.kv_cache_usage = float(values.get(KV_USAGE, 0.0))
    replica.spec_drafts = values.get(SPEC_DRAFTS, 0.0)
    replica.spec_accepted = values.get(SPEC_ACCEPTED, 0.0)
    replica.spec_draft_tokens = values.get(SPEC_DRAFT_TOKENS, 0.0)
    replica.prefix_queries = values.get(PREFIX_QUERIES, 0.0)
    replica.prefix_hits = values.get(PREFIX_HITS, 0.0)
    replica.engine_preemptions = values.get(PREEMPTIONS, 0.0)
    if KV_BLOCKS in values:  # an exposition without the info gauge keeps what was known
        replica.kv_num_blocks = int(values[KV_BLOCKS])
        replica.kv_block_size = int(values.get(KV_BLOCK_SIZE, 0))
    replica.engine_load_at = now


class LoadScraper:
    """Reads every replica's ``/metrics`` each ``interval_s`` (per pool; 0 = never)."""

    def __init__(self, pools: PoolRegistry, upstream: Upstream, timeout_s: float = 1.0) -> None:
        self.pools = pools
        self.upstream = upstream
        self.timeout_s = timeout_s
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """One loop task per pool with a non-zero interval."""
        loop = asyncio.get_running_loop()
        for pool in self.pools.all():
            interval = pool.config.routing.load_scrape_interval_s
            if interval > 0:
                self._tasks.append(loop.create_task(self._run(pool.key, interval)))

    async def stop(self) -> None:
        """Cancel the loops."""
        await cancel_and_wait(self._tasks)
        self._tasks.clear()

    async def _run(self, pool_key: str, interval_s: float) -> None:
        pool = next(p for p in self.pools.all() if p.key == pool_key)
        while True:
            await asyncio.gather(*(self.scrape(r, interval_s) for r in pool.replicas))
            await asyncio.sleep(interval_s)

    async def scrape(self, r: Replica, interval_s: float = 1.0) -> None:
        """Scrape one replica; errors leave its old values to go stale."""
        try:
            status, body = await self.upstream.get(r.url + "/metrics", self.timeout_s)
            if status != 200:
                return
            info: dict[str, str] = {}
            values = parse_engine_metrics(body.decode("utf-8", "replace"), info)
        except (UpstreamConnectError, ValueError) as e:
            log.debug("metrics scrape of %s failed: %r", r.safe_url, e)
            return
        apply_engine_metrics(r, values, time.monotonic())
        r.kv_cache_dtype = info.get("cache_dtype", r.kv_cache_dtype)
        if not r.max_model_len:
            await self.scrape_models(r)

    async def scrape_models(self, r: Replica) -> None:
        """Read ``max_model_len`` from the replica's ``GET /v1/models`` (once known, kept)."""
        try:
            status, body = await self.upstream.get(r.url + "/v1/models", self.timeout_s)
            if status == 200:
                r.max_model_len = parse_max_model_len(json.loads(body))
        except (UpstreamConnectError, ValueError) as e:
            log.debug("models scrape of %s failed: %r", r.safe_url, e)
