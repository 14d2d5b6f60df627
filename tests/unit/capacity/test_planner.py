"""Replica capacity by vLLM V1's block arithmetic, and the ``speedgate capacity`` command."""

from __future__ import annotations

import json

import pytest

from gateway.capacity.footprint import kv_footprint
from gateway.capacity.planner import (
    GIB,
    PlanError,
    ReplicaSpec,
    replica_capacity,
    replicas_needed,
    sessions_per_replica,
    weights_bytes,
)
from gateway.capacity.presets import PRESETS
from gateway.cli import main

TINY = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
        "head_dim": 32, "hidden_size": 128, "intermediate_size": 256, "vocab_size": 2048,
        "torch_dtype": "float32", "max_position_embeddings": 4096}


def test_blocks_tokens_and_concurrency_follow_vllm() -> None:
    fp = kv_footprint(TINY, kv_dtype="bfloat16")  # 1024 B/token
    cap = replica_capacity(fp, ReplicaSpec(kv_cache_memory_bytes=64 << 20, block_size=128,
                                           max_model_len=2048))
    assert (cap.num_blocks, cap.kv_tokens, cap.max_concurrency) == (512, 65_536, 32.0)
    assert cap.fits_max_model_len
    # a pool one byte short of a block rounds down
    cap = replica_capacity(fp, ReplicaSpec(kv_cache_memory_bytes=(1 << 20) - 1, block_size=128,
                                           max_model_len=2048))
    assert cap.num_blocks == 7 and not cap.fits_max_model_len  # 16 blocks per 2048 tokens


def test_gpu_pool_is_utilization_minus_weights_per_rank() -> None:
    fp = kv_footprint(PRESETS["llama-3-70b"].config, tp=8)
    w = weights_bytes(70.6, "bfloat16")
    spec = ReplicaSpec(gpu_memory_gib=141, tp=8, weights_bytes=w, max_model_len=1 << 20)
    cap = replica_capacity(fp, spec)
    pool = int(141 * GIB * 0.9 - -(-w // 8))
    assert cap.kv_pool_bytes_per_gpu == pool
    assert cap.num_blocks == pool // (40_960 * 16)
    assert sessions_per_replica(fp, cap, 1 << 20) == cap.num_blocks // 65_536 == 2
    assert replicas_needed(fp, cap, 20, 1 << 20) == 10
    assert sessions_per_replica(fp, cap, (1 << 20) + 1) == 0  # over max_model_len


def test_deepseek_tp8_holds_no_1m_session_but_pp8_holds_five() -> None:
    w = weights_bytes(671, "fp8")
    for tp, pp, sessions in ((8, 1, 0), (1, 8, 5)):
        fp = kv_footprint(PRESETS["deepseek-v3"].config, tp=tp, pp=pp)
        cap = replica_capacity(fp, ReplicaSpec(tp=tp, pp=pp, weights_bytes=w,
                                               max_model_len=1 << 20))
        assert sessions_per_replica(fp, cap, 1 << 20) == sessions
    assert replicas_needed(fp, cap, 20, 1 << 20) == 4


def test_no_memory_left_names_the_numbers() -> None:
    fp = kv_footprint(PRESETS["deepseek-v3"].config)
    with pytest.raises(PlanError, match=r"no memory left .* weights 624\.9 GiB per GPU"):
        replica_capacity(fp, ReplicaSpec(weights_bytes=weights_bytes(671, "fp8")))
    with pytest.raises(PlanError, match="unknown weights dtype"):
        weights_bytes(1, "fp3")


def test_cli_json_and_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capacity", "llama-3-70b", "--tp", "8", "--max-model-len", "1048576",
                 "--workload", "standard=20x1M", "--workload", "fast=3x128k",
                 "--draft", "llama-3-8b", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    std, fast = report["tiers"]["standard"], report["tiers"]["fast"]
    assert report["kv_bytes_per_token_unsharded"] == 327_680
    assert std["kv_bytes_per_token_per_gpu"] == 40_960
    assert std["sessions"]["1048576"] == 2 and std["workload"][0]["replicas"] == 10
    # the draft's weights and KV layers shrink the fast tier's pool
    assert fast["weights_gib_per_gpu"] > std["weights_gib_per_gpu"]
    assert fast["kv_bytes_per_token_per_gpu"] == 40_960 + 32 * 2 * 1 * 128 * 2
    assert fast["kv_tokens"] < std["kv_tokens"] and fast["workload"][0]["tokens"] == 131_072
    assert main(["capacity", "deepseek-v3", "--tp", "8", "--max-model-len", "1048576"]) == 0
    table = capsys.readouterr().out
    assert "KV bytes per token (whole model): 70,272" in table and "will not start" in table


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["nope-model"], "cannot read model config"),
        (["llama-3-70b", "--tp", "0"], "--tp must be >= 1"),
        (["llama-3-70b", "--workload", "standard=20"], "TIER=SESSIONSxTOKENS"),
        (["llama-3-70b", "--workload", "fast=3x0"], "must be >= 1"),
        (["llama-3-70b", "--kv-cache-memory-bytes", "lots"], "is not a byte count"),
        (["deepseek-v3"], "no memory left for the KV cache"),
        (["deepseek-v3", "--kv-cache-dtype", "fp9", "--tp", "8"], "unknown KV cache dtype"),
    ],
)
def test_cli_bad_input_exits_2(argv: list[str], message: str,
                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capacity", *argv]) == 2
    assert message in capsys.readouterr().err


def test_every_does_not_fit_names_its_limit(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    """1M = 1,048,576 tokens against a model whose max_position_embeddings is 1,010,000 said
    only "does not fit" (and 0 sessions of 1M): now the limit and the numbers, in the table and
    in the JSON; and a sequence the KV pool cannot hold names blocks and GiB against the pool."""
    cfg = {**PRESETS["llama-3-8b"].config, "max_position_embeddings": 1_010_000}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    argv = ["capacity", str(tmp_path), "--params-b", "8", "--workload", "standard=20x1M"]
    assert main(argv) == 0
    table = capsys.readouterr().out
    why = "1,048,576 tokens is above the model's max_position_embeddings 1,010,000"
    assert f"replicas for 20 x 1M: does not fit (standard): {why}" in table
    assert f"0 sessions of 1M tokens (standard, fast): {why}" in table
    assert main([*argv, "--json"]) == 0
    std = json.loads(capsys.readouterr().out)["tiers"]["standard"]
    assert std["workload"][0] == {"sessions": 20, "tokens": 1 << 20, "replicas": None,
                                  "reason": why}
    assert std["sessions_reasons"] == {"1048576": why}
    assert not std["starts"] and std["starts_reason"].startswith(
        "one sequence of 1,010,000 tokens needs 63,125 KV blocks")
    # the pool: 1 GiB of KV at 131,072 bytes per token holds 8,192 tokens (512 blocks)
    assert main(["capacity", "llama-3-8b", "--kv-cache-memory-bytes", "1G",
                 "--max-model-len", "32768", "--workload", "standard=1x16k"]) == 0
    table = capsys.readouterr().out
    assert ("will not start (standard, fast): one sequence of 32,768 tokens needs 2,048 KV "
            "blocks of 16 tokens (4.00 GiB per GPU at 131,072 bytes per token), the KV pool "
            "holds 512 (1.00 GiB per GPU)") in table
    assert "replicas for 1 x 16k: does not fit (standard): one sequence of 16,384 tokens" in table
    assert "0 sessions of 1M tokens (standard, fast): 1,048,576 tokens is above " \
           "--max-model-len 32,768" in table


def test_a_max_model_len_above_the_models_context_will_not_start(
        tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--max-model-len 200000`` for llama-3-8b (max_position_embeddings 131,072): vLLM
    refuses to start, so the replica "will not start" with the reason (it was reported as
    holding 4.59 sequences of 200,000 tokens); a rope_scaling factor raises the limit as vLLM
    derives it (yarn from original_max_position_embeddings, llama3 unscaled)."""
    from gateway.capacity.checks import derived_context

    assert main(["capacity", "llama-3-8b", "--max-model-len", "200000", "--json"]) == 0
    std = json.loads(capsys.readouterr().out)["tiers"]["standard"]
    assert not std["starts"]
    assert std["starts_reason"].startswith(
        "--max-model-len 200,000 is above the model's longest context 131,072")
    assert main(["capacity", "llama-3-8b", "--max-model-len", "131072", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tiers"]["standard"]["starts"]
    base = {"max_position_embeddings": 32_768}
    assert derived_context(base) == 32_768
    assert derived_context({**base, "rope_scaling": {"type": "dynamic", "factor": 2.0}}) == 65_536
    assert derived_context({**base, "rope_scaling": {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}}) == 16_384
    assert derived_context({**base, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}) == (
        32_768)
    assert derived_context({}) is None
