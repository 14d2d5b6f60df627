"""KV bytes per token from config.json fields: the issue's figures and the sharding rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.capacity.footprint import FootprintError, kv_footprint, load_model_config
from gateway.capacity.presets import PRESETS, preset

LLAMA_70B = PRESETS["llama-3-70b"].config
DEEPSEEK = PRESETS["deepseek-v3"].config


@pytest.mark.parametrize(
    ("name", "kv_dtype", "tp", "pp", "expected"),
    [
        # MLA: 61 × (512 + 64) × 2 B; the latent is replicated on every TP rank
        ("deepseek-v3", "auto", 1, 1, 70_272),
        ("deepseek-v3", "auto", 8, 1, 70_272),
        ("deepseek-v3", "auto", 1, 8, 8 * 576 * 2),  # ceil(61/8) = 8 layers per stage
        ("deepseek-v3", "fp8", 1, 1, 61 * 576),
        ("deepseek-v3", "fp8_ds_mla", 1, 1, 61 * 656),
        ("kimi-k2", "auto", 1, 1, 70_272),
        # GQA: 2 × 80 × 8 × 128 × 2 B; heads sharded over TP, one kept per rank past kv_heads
        ("llama-3-70b", "auto", 1, 1, 327_680),
        ("llama-3-70b", "auto", 8, 1, 40_960),
        ("llama-3-70b", "auto", 16, 1, 40_960),
        ("llama-3-70b", "auto", 4, 2, 2 * 40 * 2 * 128 * 2),
        ("llama-3-70b", "fp8", 1, 1, 163_840),
        ("llama-3-8b", "auto", 1, 1, 2 * 32 * 8 * 128 * 2),
    ],
)
def test_bytes_per_token(name: str, kv_dtype: str, tp: int, pp: int, expected: int) -> None:
    assert kv_footprint(PRESETS[name].config, kv_dtype=kv_dtype, tp=tp, pp=pp).bytes_per_token \
        == expected


def test_head_dim_defaults_to_hidden_over_heads_and_kv_heads_to_heads() -> None:
    fp = kv_footprint({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 128,
                       "torch_dtype": "float32"})
    assert fp.kind == "gqa" and fp.bytes_per_token == 2 * 2 * 4 * 32 * 4


def test_sliding_window_layers_hold_at_most_the_window() -> None:
    oss = kv_footprint(PRESETS["gpt-oss-120b"].config)  # 18 sliding (128) + 18 full layers
    assert (oss.full_layers, oss.window_layers, oss.window) == (18, 18, 128)
    layer = 2 * 8 * 64 * 2
    # 1M tokens: full layers keep all, sliding layers 128 tokens + one block
    assert oss.session_bytes(1 << 20) == (1 << 20) * 18 * layer + (128 + 16) * 18 * layer
    assert oss.session_bytes(100) == 112 * 36 * layer  # under the window: every layer
    mistral = kv_footprint(PRESETS["mistral-7b-v0.1"].config)  # every layer windowed
    assert mistral.full_layers == 0 and mistral.session_bytes(1 << 20) == \
        mistral.session_bytes(4096 + 16)
    off = {**PRESETS["mistral-7b-v0.1"].config, "use_sliding_window": False}
    assert kv_footprint(off).window is None


def test_session_blocks_are_vllm_cdiv_without_windows() -> None:
    fp = kv_footprint(LLAMA_70B)
    assert fp.session_blocks(2048, 128) == 16 and fp.session_blocks(2049, 128) == 17


def test_multimodal_text_config_and_config_folder(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "x", "text_config": LLAMA_70B}))
    assert kv_footprint(load_model_config(tmp_path)).bytes_per_token == 327_680


@pytest.mark.parametrize(
    ("cfg", "kwargs", "message"),
    [
        (LLAMA_70B, {"kv_dtype": "fp9"}, "unknown KV cache dtype 'fp9'"),
        (LLAMA_70B, {"kv_dtype": "fp8_ds_mla"}, "MLA models only"),
        (LLAMA_70B, {"tp": 0}, "must be >= 1"),
        ({"hidden_size": 8}, {}, "num_hidden_layers"),
    ],
)
def test_bad_input_is_named(cfg: dict, kwargs: dict, message: str) -> None:
    with pytest.raises(FootprintError, match=message):
        kv_footprint(cfg, **kwargs)


def test_unreadable_config(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(FootprintError, match="cannot read model config"):
        load_model_config(tmp_path / "bad.json")


def test_presets_by_alias() -> None:
    assert preset("Kimi-K2-Instruct") is PRESETS["kimi-k2"] and preset("nope") is None
    assert DEEPSEEK["kv_lora_rank"] == 512
