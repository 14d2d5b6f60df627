"""The demo's replica KV pool: a token count or a capacity preset on H200s."""

from __future__ import annotations

import pytest

from gateway.capacity.kv_size import DEFAULT_KV_SIZE, DEMO_MAX_MODEL_LEN, kv_size, parse_tokens


def test_the_default_is_llama_70b_on_an_h200_node_holding_two_million_token_sequences() -> None:
    kv = kv_size(DEFAULT_KV_SIZE, DEMO_MAX_MODEL_LEN)
    assert (kv.num_blocks, kv.block_size, kv.tokens) == (180_981, 16, 2_895_696)
    assert kv.tokens // DEMO_MAX_MODEL_LEN == 2
    assert "speedgate capacity llama-3-70b --tp 8" in kv.source


@pytest.mark.parametrize("spec,tokens", [
    ("2895696", 2_895_696), ("64k", 65_536), ("3M", 3 << 20), ("1.5M", 1_572_864),
    ("llama-3.1-8b:tp1", 917_024), ("gpt-oss-120b:tp1", 1_054_656),
])
def test_counts_and_presets(spec: str, tokens: int) -> None:
    assert kv_size(spec, DEMO_MAX_MODEL_LEN).tokens == tokens


@pytest.mark.parametrize("spec,words", [
    ("nope", "neither a token count"), ("8", "at least one block"),
    ("llama-3-70b:tp1", "no memory left"), ("llama-3-70b:tp3", "divisible"),
])
def test_refusals_say_why(spec: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        kv_size(spec, DEMO_MAX_MODEL_LEN)


def test_parse_tokens() -> None:
    assert parse_tokens("128k") == 131_072 and parse_tokens("1M") == DEMO_MAX_MODEL_LEN
    assert parse_tokens("1 M") is None and parse_tokens("x") is None
