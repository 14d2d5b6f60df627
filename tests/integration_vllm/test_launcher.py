"""The launcher's command lines and the demo's ``--engine`` option (no server needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engines.vllm.launcher import NGRAM_SPEC, replica_env, serve_args
from engines.vllm.tinymodel import model_dir, recipe_hash
from engines.vllm.venv import REQUIREMENTS, stamp_text, venv_dir
from gateway.cli import build_parser


def test_fast_tier_adds_ngram_speculative_config_only() -> None:
    std = serve_args("standard", 8001, Path("/m"), "mymodel")
    fast = serve_args("fast", 8002, Path("/m"), "mymodel")
    assert "--speculative-config" not in std
    spec = json.loads(fast[fast.index("--speculative-config") + 1])
    assert spec == NGRAM_SPEC and spec["method"] == "ngram"
    for args in (std, fast):
        assert args[:2] == ["-m", "vllm.entrypoints.openai.api_server"]
        for flag in ("--enable-prefix-caching", "--enable-prompt-tokens-details", "-O0"):
            assert flag in args
    with pytest.raises(ValueError):
        serve_args("turbo", 1, Path("/m"), "m")


def test_replica_env_is_private_and_offline(tmp_path: Path) -> None:
    env = replica_env(tmp_path)
    assert env["TMPDIR"].startswith(str(tmp_path))
    assert env["VLLM_CACHE_ROOT"].startswith(str(tmp_path))
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


def test_cache_locations_are_outside_the_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    repo = Path(__file__).resolve().parents[2]
    assert repo not in venv_dir().parents and repo not in model_dir().parents
    assert model_dir().name == f"tiny-llama-{recipe_hash()}"
    assert REQUIREMENTS[0] in stamp_text()
    monkeypatch.setenv("SPEEDGATE_VLLM_VENV", "/x/venv")
    assert venv_dir() == Path("/x/venv")


def test_demo_cli_engine_option() -> None:
    args = build_parser().parse_args(["demo", "--engine", "vllm"])
    assert args.engine == "vllm" and args.replicas is None
    assert build_parser().parse_args(["demo"]).engine == "sim"
