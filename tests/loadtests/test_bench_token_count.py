"""The token-count micro-benchmark at a small size: same counts both ways, and turn N+1 hands
the tokenizer only its new text when the cache holds turn N."""

from __future__ import annotations

from loadtests import bench_token_count


def test_bench_token_count_small() -> None:
    res = bench_token_count.run(tokens=30_000, repeats=1)
    for shape, r in res.items():
        assert r["tokens"] > 25_000
        assert r["before"]["encoded_chars"] > 100_000
        # the new turn is 40,000 characters (+2,000 for the reply); plus at most a block's tail
        assert r["after"]["encoded_chars"] < 40_000 + 2_000 + 2 * 2048 + 64, shape
