"""Named architectures for the planner: the ``config.json`` fields the KV footprint reads, and
the parameter count that sizes the weights.

Each entry is copied from the model's published ``config.json`` on the Hugging Face Hub (the
repo named in ``source``); ``params_b`` is the total parameter count in billions from its model
card (MoE models: all experts, since every expert's weights are resident).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Preset:
    """A named model: ``config`` (the footprint's fields of its ``config.json``), ``params_b``
    (billions of parameters), ``weights_dtype`` (the dtype its checkpoint ships in) and
    ``source`` (the Hub repo the numbers come from)."""

    config: dict[str, Any]
    params_b: float
    weights_dtype: str
    source: str
    aliases: tuple[str, ...] = field(default=())


_DEEPSEEK_V3 = {
    "model_type": "deepseek_v3", "num_hidden_layers": 61, "num_attention_heads": 128,
    "num_key_value_heads": 128, "hidden_size": 7168, "kv_lora_rank": 512,
    "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
    "torch_dtype": "bfloat16", "max_position_embeddings": 163840,
}  # fmt: skip

PRESETS: dict[str, Preset] = {
    "deepseek-v3": Preset(_DEEPSEEK_V3, 671, "fp8", "deepseek-ai/DeepSeek-V3"),
    "kimi-k2": Preset({**_DEEPSEEK_V3, "num_attention_heads": 64, "num_key_value_heads": 64,
                       "max_position_embeddings": 131072}, 1026, "fp8",
                      "moonshotai/Kimi-K2-Instruct"),
    "llama-3-70b": Preset({
        "model_type": "llama", "num_hidden_layers": 80, "num_attention_heads": 64,
        "num_key_value_heads": 8, "hidden_size": 8192, "head_dim": 128,
        "torch_dtype": "bfloat16", "max_position_embeddings": 131072,
    }, 70.6, "bfloat16", "meta-llama/Llama-3.1-70B-Instruct"),
    "llama-3-8b": Preset({
        "model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "hidden_size": 4096, "head_dim": 128,
        "torch_dtype": "bfloat16", "max_position_embeddings": 131072,
    }, 8.03, "bfloat16", "meta-llama/Llama-3.1-8B-Instruct"),
    "mistral-7b-v0.1": Preset({
        "model_type": "mistral", "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "hidden_size": 4096, "sliding_window": 4096,
        "torch_dtype": "bfloat16", "max_position_embeddings": 32768,
    }, 7.24, "bfloat16", "mistralai/Mistral-7B-v0.1"),
    "gpt-oss-120b": Preset({
        "model_type": "gpt_oss", "num_hidden_layers": 36, "num_attention_heads": 64,
        "num_key_value_heads": 8, "head_dim": 64, "hidden_size": 2880, "sliding_window": 128,
        "layer_types": ["sliding_attention", "full_attention"] * 18,
        "torch_dtype": "bfloat16", "max_position_embeddings": 131072,
    }, 117, "mxfp4", "openai/gpt-oss-120b"),
}
ALIASES = {"kimi-k2-instruct": "kimi-k2", "deepseek-r1": "deepseek-v3",
           "llama-3.1-70b": "llama-3-70b", "llama-3.1-8b": "llama-3-8b"}


def preset(name: str) -> Preset | None:
    """The preset called ``name`` (case-insensitive, aliases included), else None."""
    key = name.lower()
    return PRESETS.get(ALIASES.get(key, key))
