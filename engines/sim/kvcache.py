"""KV cache of ``num_blocks`` blocks of ``block_size`` tokens with automatic prefix caching.

Modelled on vLLM's V1 KV cache manager (vllm/v1/core/kv_cache_utils.py, block_pool.py):

- every *full* block of prompt tokens is identified by a chain hash
  ``hash(parent_block_hash, block_tokens)`` (:func:`engines.sim.textgen.block_hashes`), so a block
  hash names the whole prefix up to and including that block;
- a request reuses the longest run of its leading block hashes already resident (cache hit);
  like vLLM, at least the last prompt token is always recomputed, so a full hit drops one block;
- blocks held by running requests are in use (``usage`` = ``vllm:kv_cache_usage_perc``); freed
  hashed blocks stay resident and evictable in LRU order until space is needed.

Each allocation reserves, besides the hashed prompt blocks, private blocks for the partial last
prompt block and the whole output, so a running request never needs preemption (vLLM allocates
decode blocks lazily and preempts on exhaustion; reserving up front keeps the simulator simple
and errs towards a fuller cache).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(slots=True)
class Allocation:
    """Blocks held by one sequence: hashed prompt blocks plus ``private`` anonymous blocks."""

    hashes: list[int]
    private: int
    cached_blocks: int

    def cached_tokens(self, block_size: int) -> int:
        """Prompt tokens served from the prefix cache."""
        return self.cached_blocks * block_size


class PrefixCache:
    """Block allocator with automatic prefix caching and LRU eviction (not thread-safe)."""

    def __init__(self, num_blocks: int, block_size: int = 16) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._refs: dict[int, int] = {}  # resident hashed block -> reference count
        self._evictable: OrderedDict[int, None] = OrderedDict()  # refcount 0, LRU first
        self._private = 0  # anonymous blocks in use
        self.queries = 0  # prompt tokens looked up (vllm:prefix_cache_queries)
        self.hits = 0  # prompt tokens found (vllm:prefix_cache_hits)

    @property
    def used_blocks(self) -> int:
        """Blocks referenced by running sequences."""
        return len(self._refs) - len(self._evictable) + self._private

    @property
    def free_blocks(self) -> int:
        """Blocks neither in use nor resident (evictable blocks are not counted as free)."""
        return self.num_blocks - len(self._refs) - self._private

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, 0..1 (vLLM's ``kv_cache_usage_perc``)."""
        return self.used_blocks / self.num_blocks if self.num_blocks else 0.0

    def match(self, hashes: list[int]) -> int:
        """Number of leading blocks of ``hashes`` resident in the cache."""
        n = 0
        refs = self._refs
        for h in hashes:
            if h not in refs:
                break
            n += 1
        return n

    def allocate(
        self, hashes: list[int], prompt_tokens: int, total_blocks: int
    ) -> Allocation | None:
        """Reserve ``total_blocks`` blocks for a sequence whose full prompt blocks are ``hashes``.

        Returns None when the blocks cannot be found even after evicting every evictable block
        (the caller keeps the request waiting). Raises ValueError when the request could never
        fit. Counts the prefix-cache query and hit tokens.
        """
        if total_blocks > self.num_blocks:
            raise ValueError(f"request needs {total_blocks} KV blocks, cache has {self.num_blocks}")
        hit = self.match(hashes)
        if hit and hit * self.block_size >= prompt_tokens:
            hit -= 1  # the last prompt token is always recomputed
        new_hashed = len(hashes) - hit
        private = total_blocks - len(hashes)
        need = new_hashed + private
        refs, evictable = self._refs, self._evictable
        # Blocks this request reuses must not be evicted to make room for it.
        reusable_idle = sum(1 for h in hashes[:hit] if refs[h] == 0)
        if need > self.free_blocks + len(evictable) - reusable_idle:
            return None
        for h in hashes[:hit]:
            if refs[h] == 0:
                del evictable[h]
            refs[h] += 1
        while self.free_blocks < need:
            victim, _ = evictable.popitem(last=False)
            del refs[victim]
        for h in hashes[hit:]:
            if h in refs:  # resident after a gap in the chain (cannot happen with chain hashes)
                if refs[h] == 0:
                    del evictable[h]
                refs[h] += 1
            else:
                refs[h] = 1
        self._private += private
        self.queries += prompt_tokens
        self.hits += hit * self.block_size
        return Allocation(hashes=hashes, private=private, cached_blocks=hit)

    def grow(self, alloc: Allocation, blocks: int) -> bool:
        """Add ``blocks`` private blocks to a running sequence (its decode tokens), evicting
        idle cached blocks in LRU order; False, and nothing taken, when the pool has not that
        many (vLLM ``KVCacheManager.allocate_slots`` returning None: the scheduler preempts)."""
        if blocks <= 0:
            return True
        if blocks > self.free_blocks + len(self._evictable):
            return False
        while self.free_blocks < blocks:
            victim, _ = self._evictable.popitem(last=False)
            del self._refs[victim]
        self._private += blocks
        alloc.private += blocks
        return True

    def free(self, alloc: Allocation) -> None:
        """Release a sequence's blocks; its hashed blocks stay resident as most recently used."""
        refs, evictable = self._refs, self._evictable
        for h in reversed(alloc.hashes):  # deeper blocks evicted first, like vLLM's free order
            n = refs[h] - 1
            refs[h] = n
            if n == 0:
                evictable[h] = None
        self._private -= alloc.private
        alloc.hashes = []
        alloc.private = 0

    def clear(self) -> None:
        """Drop every evictable block and reset the query/hit counters (``/sim/reset``)."""
        for h in self._evictable:
            del self._refs[h]
        self._evictable.clear()
        self.queries = 0
        self.hits = 0
