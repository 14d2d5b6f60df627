"""``speedgate capacity`` refuses input it cannot plan for with a clean error (exit 2): infinite
or non-positive sizes, layouts vLLM refuses, an absurd ``max_position_embeddings``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.capacity.presets import preset
from gateway.cli import main


def test_capacity_infinite_gpu_memory_is_a_clean_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--gpu-memory-gib inf`` died with OverflowError in ``replica_capacity``."""
    assert main(["capacity", "llama-3-70b", "--gpu-memory-gib", "inf"]) == 2
    assert "speedgate capacity:" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["--params-b", "-1"],          # negative weights: more KV than the GPU holds
    ["--params-b", "0"],           # a 70B model with no weights
    ["--reserved-gib", "-100"],    # negative activation memory adds 100 GiB of KV
    ["--spec-extra-gib", "-100"],  # the fast tier ends up with more KV than the standard one
    ["--draft", "llama-3-8b", "--draft-params-b", "-1"],
])
def test_capacity_refuses_negative_sizes(argv: list[str],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capacity", "llama-3-70b", "--tp", "8", *argv]) == 2
    assert "speedgate capacity:" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["--pp", "1000"],  # 80 layers over 1000 stages (vllm/distributed/utils.py get_pp_indices)
    ["--tp", "3"],     # 64 attention heads (vllm/config/model.py verify_with_parallel_config)
])
def test_capacity_refuses_layouts_vllm_refuses(argv: list[str],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capacity", "llama-3-70b", *argv]) == 2
    assert "speedgate capacity:" in capsys.readouterr().err


@pytest.mark.parametrize("value", [1e30, 10**30, -5, "128k"])
def test_capacity_refuses_a_bad_max_position_embeddings(
    value: object, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """A config's ``max_position_embeddings`` of 1e30 was printed as a 10**30-token context."""
    cfg = {**preset("llama-3-70b").config, "max_position_embeddings": value}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert main(["capacity", str(path), "--tp", "8", "--params-b", "70"]) == 2
    assert "max_position_embeddings" in capsys.readouterr().err
