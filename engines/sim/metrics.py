"""Prometheus metrics with vLLM's names (V1 engine), in a registry of the app's own.

Names as exposed by vLLM's ``/metrics`` (vllm/v1/metrics/loggers.py, labels ``model_name`` and
``engine``): gauges ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
``vllm:kv_cache_usage_perc`` (0..1); counters (exposed with the ``_total`` suffix)
``vllm:prefix_cache_queries`` and ``vllm:prefix_cache_hits`` (tokens), ``vllm:prompt_tokens``,
``vllm:generation_tokens``, ``vllm:request_success`` (label ``finished_reason``), and in
speculative mode ``vllm:spec_decode_num_drafts``, ``vllm:spec_decode_num_draft_tokens``,
``vllm:spec_decode_num_accepted_tokens``; ``vllm:num_preemptions`` (requests preempted by
recompute) and the info gauge ``vllm:cache_config_info`` (value 1; the cache config as labels,
``num_gpu_blocks``, ``block_size``, ``cache_dtype`` among them: ``log_metrics_info``).
Simulator-only: ``sim_requests``,
``sim_aborted_requests`` (the client disconnected before the end), ``sim_recomputed_tokens``
(tokens that sequences preempted by recompute must prefill again: prompt + output so far).
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

__all__ = ["CONTENT_TYPE", "SimMetrics"]


class SimMetrics:
    """The replica's metric children, bound to its model name (label values fixed)."""

    def __init__(
        self, model_name: str, speculative: bool, *, num_gpu_blocks: int = 0,
        block_size: int = 16,
    ) -> None:
        self.registry = reg = CollectorRegistry(auto_describe=True)
        labels = ["model_name", "engine"]
        values = (model_name, "0")

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=reg).labels(*values)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=reg).labels(*values)

        self.running = gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        self.waiting = gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        self.kv_usage = gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        )
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        )
        self.prefix_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.preemptions = counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        )
        info = {"block_size": str(block_size), "num_gpu_blocks": str(num_gpu_blocks),
                "cache_dtype": "auto", "enable_prefix_caching": "True", "engine": "0"}
        Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
              list(info), registry=reg, multiprocess_mode="mostrecent").labels(**info).set(1)
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*labels, "finished_reason"],
            registry=reg,
        )
        # vLLM exports every reason from the start; the simulator only finishes with the first 3
        reasons = ("stop", "length", "abort", "error", "repetition")
        self.success = {r: success.labels(*values, r) for r in reasons}
        self.success_family = success
        self._values = values
        self.spec_drafts = self.spec_draft_tokens = self.spec_accepted = None
        if speculative:
            self.spec_drafts = counter(
                "vllm:spec_decode_num_drafts", "Number of spec decoding drafts."
            )
            self.spec_draft_tokens = counter(
                "vllm:spec_decode_num_draft_tokens", "Number of draft tokens."
            )
            self.spec_accepted = counter(
                "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."
            )
        self.sim_requests = Counter(
            "sim_requests", "Requests received by the simulator.", ["model_name"], registry=reg
        ).labels(model_name)
        self.sim_aborted = Counter(
            "sim_aborted_requests",
            "Requests whose client disconnected before the end.",
            ["model_name"],
            registry=reg,
        ).labels(model_name)
        self.sim_recomputed = Counter(
            "sim_recomputed_tokens",
            "Tokens preempted sequences must prefill again (prompt + output so far).",
            ["model_name"],
            registry=reg,
        ).labels(model_name)

    def finished(self, reason: str) -> None:
        """Count one successfully finished sequence by ``finish_reason``."""
        child = self.success.get(reason)
        if child is None:
            child = self.success[reason] = self.success_family.labels(*self._values, reason)
        child.inc()

    def render(self, running: int, waiting: int, kv_usage: float) -> bytes:
        """Prometheus text exposition, with the gauges set to the given engine state."""
        self.running.set(running)
        self.waiting.set(waiting)
        self.kv_usage.set(kv_usage)
        return generate_latest(self.registry)
