"""Checks on ``speedgate capacity``'s input before any arithmetic: counts and sizes the user
gives, and layouts vLLM itself refuses. Each raises ``PlanError`` (the command's exit 2).

vLLM's rules mirrored (vLLM 0.11+, paths in its wheel):

- tensor parallelism: ``ModelConfig.verify_with_parallel_config`` (``vllm/config/model.py``)
  raises "Total number of attention heads (H) must be divisible by tensor parallel size (T)";
- pipeline parallelism: ``get_pp_indices`` (``vllm/distributed/utils.py``) gives each stage
  ``num_hidden_layers // pp_size`` layers, so past the layer count a stage holds none: every
  stage must hold one layer at least.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from gateway.capacity.planner import PlanError

#: Largest ``max_position_embeddings`` taken from a config (2**32 tokens: no model comes near).
MAX_CONTEXT = 1 << 32


def check_counts(args: argparse.Namespace) -> None:
    """Reject non-positive counts and sizes, and non-finite ones, of parsed arguments."""
    for name in ("tp", "pp", "block_size"):
        if getattr(args, name) < 1:
            raise PlanError(f"--{name.replace('_', '-')} must be >= 1")
    if args.max_model_len is not None and args.max_model_len < 1:
        raise PlanError("--max-model-len must be >= 1")
    if not math.isfinite(args.gpu_memory_gib) or args.gpu_memory_gib <= 0:
        raise PlanError("--gpu-memory-gib must be a finite number > 0")
    for name in ("params_b", "draft_params_b"):
        value = getattr(args, name, None)
        if value is not None and (not math.isfinite(value) or value <= 0):
            raise PlanError(f"--{name.replace('_', '-')} must be a finite number > 0")
    for name in ("reserved_gib", "spec_extra_gib"):
        value = getattr(args, name)
        if not math.isfinite(value) or value < 0:
            raise PlanError(f"--{name.replace('_', '-')} must be a finite number >= 0")


def _count(cfg: dict[str, Any], *names: str) -> int | None:
    for n in names:
        v = cfg.get(n)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def check_layout(cfg: dict[str, Any], tp: int, pp: int) -> None:
    """Refuse the ``tp``/``pp`` layouts vLLM refuses for this model config (module docstring)."""
    heads = _count(cfg, "num_attention_heads", "n_head")
    if heads is not None and heads % tp:
        raise PlanError(f"total number of attention heads ({heads}) must be divisible by "
                        f"tensor parallel size ({tp}), as vLLM requires")
    layers = _count(cfg, "num_hidden_layers", "n_layer", "num_layers")
    if layers is not None and pp > layers:
        raise PlanError(f"pipeline parallel size ({pp}) is more than the model's {layers} "
                        "layers: a stage would hold none")


def config_context(cfg: dict[str, Any]) -> int | None:
    """The config's ``max_position_embeddings`` (None when absent); ``PlanError`` unless it is
    a positive integer of at most ``MAX_CONTEXT``."""
    v = cfg.get("max_position_embeddings")
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= MAX_CONTEXT:
        raise PlanError(f"model config max_position_embeddings {v!r} is not a positive "
                        f"integer of at most {MAX_CONTEXT}")
    return v


#: RoPE scaling types whose factor vLLM does not apply to the model's context length.
UNSCALED_ROPE = ("su", "longrope", "llama3")


def derived_context(cfg: dict[str, Any]) -> int | None:
    """The longest ``max_model_len`` vLLM starts the model with (without
    ``VLLM_ALLOW_LONG_MAX_MODEL_LEN``), as vLLM derives it (``_get_and_verify_max_len``):
    ``max_position_embeddings`` times ``rope_scaling``'s ``factor`` (for ``yarn``, its
    ``original_max_position_embeddings`` times the factor; ``su``, ``longrope`` and ``llama3``
    unscaled). None when the config has no ``max_position_embeddings``."""
    base = config_context(cfg)
    rope = cfg.get("rope_scaling")
    if base is None or not isinstance(rope, dict):
        return base
    kind = rope.get("rope_type", rope.get("type"))
    factor = rope.get("factor", 1.0)
    if (kind in UNSCALED_ROPE or isinstance(factor, bool)
            or not isinstance(factor, int | float) or factor <= 0):
        return base
    original = rope.get("original_max_position_embeddings")
    if kind == "yarn" and isinstance(original, int) and not isinstance(original, bool) \
            and original > 0:
        base = original
    return int(base * factor)
