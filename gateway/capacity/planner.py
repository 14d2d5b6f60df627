"""What one engine replica holds: its KV pool in blocks and tokens, sessions per replica at a
context length, and replicas needed for a workload.

The arithmetic is vLLM V1's (``vllm/v1/core/kv_cache_utils.py``): each worker's pool is the
memory left after weights and activations (GPU: ``total × gpu_memory_utilization − weights −
reserved``; or ``--kv-cache-memory-bytes`` / ``VLLM_CPU_KVCACHE_SPACE`` when set), ``num_blocks =
pool // (bytes_per_token × block_size)``, a request of ``L`` tokens takes ``cdiv(L, block_size)``
blocks, and ``Maximum concurrency for max_model_len tokens = num_blocks / cdiv(max_model_len,
block_size)`` (``get_max_concurrency_for_kv_cache_config``). The engine refuses to start when one
``max_model_len`` sequence does not fit (``_check_enough_kv_cache_memory``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway.capacity.footprint import KvFootprint

GIB = 1 << 30
WEIGHT_DTYPE_BYTES: dict[str, float] = {
    "float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1, "int8": 1,
    "int4": 0.5, "mxfp4": 0.5, "nvfp4": 0.5,
}  # fmt: skip
CONTEXTS = (32_768, 131_072, 1_048_576)  # 32k / 128k / 1M tokens per session


class PlanError(ValueError):
    """Settings that describe no replica (no memory left for the KV cache, bad sizes)."""


@dataclass(frozen=True)
class ReplicaSpec:
    """One replica's hardware and engine settings.

    ``gpu_memory_gib``: memory of one GPU (GiB); ``tp``, ``pp``: tensor / pipeline parallel
    sizes (the replica has ``tp × pp`` GPUs); ``gpu_memory_utilization``: vLLM's fraction;
    ``weights_bytes``: the whole model's weights (split evenly over the ranks);
    ``extra_bytes_per_gpu``: the speculative method's extra memory per GPU (a draft model's
    weights share, buffers); ``reserved_gib_per_gpu``: activations and other non-KV memory that
    vLLM's profiling run measures at start-up (0: an upper bound); ``kv_cache_memory_bytes``:
    when set, the pool per rank, as vLLM's ``--kv-cache-memory-bytes`` (memory figures above then
    unused); ``block_size``: tokens per KV block (vLLM: 16 on GPU, 128 on CPU);
    ``max_model_len``: the engine's longest sequence.
    """

    gpu_memory_gib: float = 141.0
    tp: int = 1
    pp: int = 1
    gpu_memory_utilization: float = 0.9
    weights_bytes: int = 0
    extra_bytes_per_gpu: int = 0
    reserved_gib_per_gpu: float = 0.0
    kv_cache_memory_bytes: int | None = None
    block_size: int = 16
    max_model_len: int = 1_048_576

    @property
    def gpus(self) -> int:
        """GPUs (ranks) per replica."""
        return self.tp * self.pp


@dataclass(frozen=True)
class ReplicaCapacity:
    """What one replica holds. Bytes are per rank; ``num_blocks × block_size`` is vLLM's
    ``num_gpu_blocks × block_size``; ``max_concurrency`` is its start-up "Maximum concurrency
    for max_model_len tokens per request"; ``fits_max_model_len`` False means vLLM would refuse
    to start."""

    bytes_per_token: int
    weights_bytes_per_gpu: int
    kv_pool_bytes_per_gpu: int
    num_blocks: int
    block_size: int
    max_model_len: int
    max_concurrency: float
    fits_max_model_len: bool

    @property
    def kv_tokens(self) -> int:
        """Tokens the replica's pool holds (``num_blocks × block_size``)."""
        return self.num_blocks * self.block_size


def weights_bytes(params_b: float, dtype: str) -> int:
    """Bytes of ``params_b`` billion parameters stored as ``dtype``. Raises ``PlanError`` for an
    unknown dtype."""
    if dtype not in WEIGHT_DTYPE_BYTES:
        known = ", ".join(WEIGHT_DTYPE_BYTES)
        raise PlanError(f"unknown weights dtype {dtype!r} (one of: {known})")
    return int(params_b * 1e9 * WEIGHT_DTYPE_BYTES[dtype])


def replica_capacity(fp: KvFootprint, spec: ReplicaSpec) -> ReplicaCapacity:
    """The KV capacity of a replica running a model of per-rank footprint ``fp`` (already
    sharded for ``spec.tp``/``spec.pp``) on ``spec``. Raises ``PlanError`` when no memory is
    left for the KV cache, with the numbers."""
    if spec.block_size < 1 or spec.max_model_len < 1:
        raise PlanError("block_size and max_model_len must be >= 1")
    w_gpu = math.ceil(spec.weights_bytes / spec.gpus)
    if spec.kv_cache_memory_bytes is not None:
        pool = spec.kv_cache_memory_bytes
    else:
        if not 0 < spec.gpu_memory_utilization <= 1:
            raise PlanError("gpu_memory_utilization must be in (0, 1]")
        budget = spec.gpu_memory_gib * GIB * spec.gpu_memory_utilization
        pool = int(budget - w_gpu - spec.extra_bytes_per_gpu - spec.reserved_gib_per_gpu * GIB)
    if pool <= 0:
        raise PlanError(
            f"no memory left for the KV cache: {spec.gpu_memory_gib:g} GiB × "
            f"{spec.gpu_memory_utilization:g} per GPU, weights {w_gpu / GIB:.1f} GiB per GPU "
            f"over {spec.gpus} GPU(s), extra {spec.extra_bytes_per_gpu / GIB:.1f} GiB"
        )
    blocks = pool // (fp.bytes_per_token * spec.block_size)
    per_req = fp.session_blocks(spec.max_model_len, spec.block_size)
    return ReplicaCapacity(
        bytes_per_token=fp.bytes_per_token,
        weights_bytes_per_gpu=w_gpu,
        kv_pool_bytes_per_gpu=pool,
        num_blocks=blocks,
        block_size=spec.block_size,
        max_model_len=spec.max_model_len,
        max_concurrency=blocks / per_req,
        fits_max_model_len=per_req <= blocks,
    )


def sessions_per_replica(fp: KvFootprint, cap: ReplicaCapacity, tokens: int) -> int:
    """Sequences of ``tokens`` tokens that a replica holds at once without preemption (0 when
    one does not fit its pool or exceeds ``max_model_len``)."""
    if tokens > cap.max_model_len:
        return 0
    return cap.num_blocks // max(1, fp.session_blocks(tokens, cap.block_size))


def replicas_needed(
    fp: KvFootprint, cap: ReplicaCapacity, sessions: int, tokens: int
) -> int | None:
    """Replicas a workload of ``sessions`` concurrent sessions of ``tokens`` tokens each needs
    (their KV resident at once); None when one such session fits no replica."""
    per = sessions_per_replica(fp, cap, tokens)
    return math.ceil(sessions / per) if per else None


def why_no_fit(fp: KvFootprint, cap: ReplicaCapacity, tokens: int,
               max_len_name: str = "max_model_len") -> str | None:
    """Why one sequence of ``tokens`` tokens fits no replica, with the numbers (None when it
    fits): it is longer than the engine's ``max_model_len`` (``max_len_name`` says where that
    came from), or its KV blocks are more than the pool holds."""
    if tokens > cap.max_model_len:
        return f"{tokens:,} tokens is above {max_len_name} {cap.max_model_len:,}"
    need = fp.session_blocks(tokens, cap.block_size)
    if need <= cap.num_blocks:
        return None
    page = fp.bytes_per_token * cap.block_size
    return (f"one sequence of {tokens:,} tokens needs {need:,} KV blocks of {cap.block_size} "
            f"tokens ({need * page / GIB:.2f} GiB per GPU at {fp.bytes_per_token:,} bytes per "
            f"token), the KV pool holds {cap.num_blocks:,} "
            f"({cap.kv_pool_bytes_per_gpu / GIB:.2f} GiB per GPU)")
