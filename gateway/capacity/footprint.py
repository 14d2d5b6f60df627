"""KV-cache bytes per token of a model, from its Hugging Face ``config.json``.

Formulas (per token, per layer; summed over the layers one rank holds):

- standard / grouped-query attention: ``2 × kv_heads × head_dim × dtype_bytes`` (a K and a V
  vector per KV head). Source: vLLM ``vllm/v1/kv_cache_interface.py``,
  ``AttentionSpec.state_content_size_bytes = (head_size + head_size_v) × dtype size`` times
  ``num_kv_heads`` per page slot; GQA: Ainslie et al. 2023 (arXiv:2305.13245).
- multi-head latent attention (DeepSeek-V2/V3, Kimi-K2): ``(kv_lora_rank + qk_rope_head_dim) ×
  dtype_bytes``, one latent vector per token and no separate V. Source: vLLM
  ``MLAAttentionSpec`` (``head_size = kv_lora_rank + qk_rope_head_dim``, ``head_size_v = 0``,
  one KV "head"); DeepSeek-V2 paper §2.1 (arXiv:2405.04434). vLLM's ``fp8_ds_mla`` cache is 656
  bytes per token per layer (``mla_attention.py``: 512 fp8 latent + 4 float32 scales + 64 bf16
  rope dims).
- sliding-window layers (Mistral ``sliding_window``, Gemma/gpt-oss ``layer_types``) hold at most
  their window: ``min(context, window)`` tokens plus one block (the window need not start on a
  block edge: vLLM ``SlidingWindowSpec.max_admission_blocks_per_request``).

Parallelism (Megatron-style): tensor parallelism shards GQA's KV heads across ranks,
``ceil(kv_heads / tp)`` heads per rank, so a rank keeps one head when ``kv_heads < tp`` (the heads
are replicated); MLA's latent has no head axis and is replicated on every TP rank (vLLM MLA
``num_kv_heads = 1``); pipeline parallelism gives each stage ``ceil(layers / pp)`` layers. A
replica's capacity is the per-rank pool divided by the per-rank bytes per token (vLLM sizes the
pool per worker and takes the minimum).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# bytes per element: vLLM ``STR_DTYPE_TO_TORCH_DTYPE`` (vllm/utils/torch_utils.py)
DTYPE_BYTES: dict[str, float] = {
    "float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1, "int8": 1,
}  # fmt: skip
FP8_DS_MLA_BYTES = 656  # vLLM mla_attention.py: state_content_bytes {"fp8_ds_mla": 656}


class FootprintError(ValueError):
    """A config that does not describe an attention model this module knows, or a bad dtype or
    parallelism setting; the message names the field."""


@dataclass(frozen=True)
class KvFootprint:
    """One model's KV-cache footprint on one rank.

    ``kind``: ``"mla"`` | ``"gqa"``; ``layer_bytes``: bytes per token of one layer;
    ``full_layers`` keep every token, ``window_layers`` only the last ``window`` tokens
    (0 and None without sliding windows); ``kv_dtype``: the cache's element type after resolving
    ``auto``. All counts are for the layers one rank holds.
    """

    kind: str
    layer_bytes: int
    full_layers: int
    window_layers: int = 0
    window: int | None = None
    kv_dtype: str = "bfloat16"

    @property
    def layers(self) -> int:
        """Layers with a KV cache on this rank."""
        return self.full_layers + self.window_layers

    @property
    def bytes_per_token(self) -> int:
        """Bytes one token occupies across all layers of the rank: the page size per token that
        vLLM divides the pool by (``num_blocks = pool // (bytes_per_token × block_size)``)."""
        return self.layers * self.layer_bytes

    def session_bytes(self, tokens: int, block_size: int = 16) -> int:
        """Bytes one sequence of ``tokens`` tokens holds on this rank, in whole
        ``block_size``-token pages; sliding-window layers hold at most their window plus one
        block (vLLM ``SlidingWindowSpec.max_admission_blocks_per_request``, without the
        in-flight batch's share)."""
        full = -(-tokens // block_size) * block_size * self.full_layers * self.layer_bytes
        if not self.window_layers:
            return full
        held = min(tokens, self.window or tokens)
        blocks = -(-held // block_size) + (1 if self.window and tokens > self.window else 0)
        return full + blocks * block_size * self.window_layers * self.layer_bytes

    def session_blocks(self, tokens: int, block_size: int = 16) -> int:
        """Pool blocks (of ``bytes_per_token × block_size`` bytes) one sequence of ``tokens``
        tokens needs: ``cdiv(tokens, block_size)`` for a model without sliding windows, as
        vLLM's ``get_max_concurrency_for_kv_cache_config``."""
        page = self.bytes_per_token * block_size
        return -(-self.session_bytes(tokens, block_size) // page) if page else 0


def load_model_config(path: str | Path) -> dict[str, Any]:
    """A ``config.json`` (or a model folder holding one) as a dict; multimodal configs are
    reduced to their ``text_config``. Raises ``FootprintError`` when it cannot be read."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        cfg = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise FootprintError(f"cannot read model config {p}: {e}") from e
    if not isinstance(cfg, dict):
        raise FootprintError(f"{p}: not a JSON object")
    return text_config(cfg)


def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a config (``text_config`` of multimodal models)."""
    inner = cfg.get("text_config")
    return {**cfg, **inner} if isinstance(inner, dict) else cfg


def resolve_dtype(kv_dtype: str, cfg: dict[str, Any]) -> str:
    """The KV element type: ``auto`` is the model's dtype (``torch_dtype`` or ``dtype``, bf16
    when absent), as vLLM's ``--kv-cache-dtype auto``. Raises ``FootprintError`` for an unknown
    name."""
    if kv_dtype == "auto":
        kv_dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    if kv_dtype not in DTYPE_BYTES and kv_dtype != "fp8_ds_mla":
        known = ", ".join(["auto", *DTYPE_BYTES, "fp8_ds_mla"])
        raise FootprintError(f"unknown KV cache dtype {kv_dtype!r} (one of: {known})")
    return kv_dtype


def _int(cfg: dict[str, Any], *names: str, default: int | None = None) -> int:
    for n in names:
        v = cfg.get(n)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    if default is not None:
        return default
    raise FootprintError(f"model config has no positive integer {' / '.join(names)}")


def is_mla(cfg: dict[str, Any]) -> bool:
    """True for multi-head latent attention configs (``kv_lora_rank`` set)."""
    return isinstance(cfg.get("kv_lora_rank"), int) and cfg["kv_lora_rank"] > 0


def sliding_layers(cfg: dict[str, Any], layers: int) -> tuple[int, int | None]:
    """``(sliding_window_layers, window)`` from ``layer_types`` (``"sliding_attention"``
    entries) or a global ``sliding_window`` (every layer; Mistral-7B v0.1). ``(0, None)`` when
    the model attends to the whole context."""
    window = cfg.get("sliding_window")
    if not isinstance(window, int) or window <= 0:
        return 0, None
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        return sum(1 for t in types[:layers] if t == "sliding_attention"), window
    if cfg.get("use_sliding_window") is False:
        return 0, None
    return layers, window


def kv_footprint(
    cfg: dict[str, Any], *, kv_dtype: str = "auto", tp: int = 1, pp: int = 1
) -> KvFootprint:
    """The per-rank KV footprint of the model ``cfg`` (a parsed ``config.json``) under tensor
    parallelism ``tp`` and pipeline parallelism ``pp``, with cache dtype ``kv_dtype`` (``auto``,
    ``bfloat16``, ``float16``, ``float32``, ``fp8``/``fp8_e4m3``/``fp8_e5m2``, ``fp8_ds_mla``).
    Raises ``FootprintError`` on a config without the fields, a bad dtype or ``tp``/``pp < 1``."""
    if tp < 1 or pp < 1:
        raise FootprintError(f"tensor and pipeline parallel sizes must be >= 1 (tp={tp}, pp={pp})")
    cfg = text_config(cfg)
    dtype = resolve_dtype(kv_dtype, cfg)
    total_layers = _int(cfg, "num_hidden_layers", "n_layer", "num_layers")
    layers = math.ceil(total_layers / pp)
    if is_mla(cfg):
        if dtype == "fp8_ds_mla":
            per_layer = FP8_DS_MLA_BYTES
        else:
            latent = cfg["kv_lora_rank"] + _int(cfg, "qk_rope_head_dim")
            per_layer = int(latent * DTYPE_BYTES[dtype])
        kind = "mla"
    else:
        if dtype == "fp8_ds_mla":
            raise FootprintError("kv dtype fp8_ds_mla is for MLA models only")
        heads = _int(cfg, "num_attention_heads", "n_head")
        kv_heads = _int(cfg, "num_key_value_heads", "num_kv_heads", default=heads)
        head_dim = _int(cfg, "head_dim", default=_int(cfg, "hidden_size", "n_embd") // heads)
        per_layer = int(2 * math.ceil(kv_heads / tp) * head_dim * DTYPE_BYTES[dtype])
        kind = "gqa"
    n_window, window = sliding_layers(cfg, total_layers)
    window_layers = min(layers, math.ceil(n_window / pp)) if n_window else 0
    return KvFootprint(kind, per_layer, layers - window_layers, window_layers,
                       window if window_layers else None, dtype)
