"""Prefix cache: chain hashes, prefix hits, recompute of the last token, LRU eviction."""

from engines.sim.kvcache import PrefixCache
from engines.sim.textgen import block_hashes, tokenize


def test_chain_hash_names_the_whole_prefix() -> None:
    a = block_hashes(list(range(48)), 16)
    b = block_hashes([*range(16), 99, *range(17, 48)], 16)
    assert len(a) == 3
    assert a[0] == b[0] and a[1] != b[1] and a[2] != b[2]  # a change propagates down the chain
    assert block_hashes(list(range(15)), 16) == []


def test_same_block_different_parent_differs() -> None:
    x = block_hashes([1] * 16 + [2] * 16, 16)
    y = block_hashes([3] * 16 + [2] * 16, 16)
    assert x[1] != y[1]


def test_prefix_hit_after_release() -> None:
    c = PrefixCache(num_blocks=100, block_size=16)
    h = block_hashes(list(range(100)), 16)  # 6 full blocks, 4 tokens left over
    a = c.allocate(h, 100, 8)
    assert a is not None and a.cached_blocks == 0
    assert c.used_blocks == 8
    c.free(a)
    assert c.used_blocks == 0 and c.usage == 0
    b = c.allocate(h, 100, 8)
    assert b is not None and b.cached_tokens(16) == 96
    assert c.hits == 96 and c.queries == 200


def test_full_hit_recomputes_last_block() -> None:
    c = PrefixCache(10, 16)
    h = block_hashes(list(range(32)), 16)
    c.free(c.allocate(h, 32, 3))
    again = c.allocate(h, 32, 3)
    assert again.cached_blocks == 1  # the last prompt token is always recomputed


def test_lru_eviction_when_full() -> None:
    c = PrefixCache(num_blocks=4, block_size=16)
    ha = block_hashes(list(range(32)), 16)
    hb = block_hashes(list(range(100, 132)), 16)
    hc = block_hashes(list(range(200, 232)), 16)
    c.free(c.allocate(ha, 32, 2))
    c.free(c.allocate(hb, 32, 2))
    # touch A so that B is the least recently used
    a2 = c.allocate(ha, 33, 3)
    assert a2.cached_blocks == 2
    c.free(a2)
    c.free(c.allocate(hc, 32, 2))  # needs room: evicts B (LRU), keeps A
    assert c.match(ha) == 2
    assert c.match(hb) == 0


def test_in_use_blocks_are_not_evicted() -> None:
    c = PrefixCache(num_blocks=4, block_size=16)
    a = c.allocate(block_hashes(list(range(64)), 16), 64, 4)
    assert a is not None and c.usage == 1.0
    assert c.allocate(block_hashes(list(range(500, 516)), 16), 16, 1) is None
    c.free(a)
    assert c.allocate(block_hashes(list(range(500, 516)), 16), 16, 1) is not None


def test_tokenizer_is_fast_and_deterministic() -> None:
    text = "Hello, world! 안녕하세요 " * 2
    assert tokenize(text) == ["Hello", ",", "world", "!", "안녕하세요"] * 2
