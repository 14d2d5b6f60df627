"""The bounded LRU + TTL affinity table."""

import tracemalloc

from gateway.routing.table import AffinityTable


def test_lru_eviction_keeps_recently_used():
    t = AffinityTable(max_entries=3, ttl_s=100, clock=lambda: 0.0)
    for k in "abc":
        t.put(k, "r" + k)
    assert t.get("a") == "ra"  # a is now most recent
    t.put("d", "rd")
    assert t.get("b") is None and t.get("a") == "ra" and t.get("d") == "rd"
    assert len(t) == 3 and t.evicted == 1


def test_ttl_expiry():
    now = [0.0]
    t = AffinityTable(max_entries=10, ttl_s=5, clock=lambda: now[0])
    t.put(b"k", "r0")
    now[0] = 4.9
    assert t.get(b"k") == "r0"
    now[0] = 5.0
    assert t.get(b"k") is None and len(t) == 0


def test_memory_bound():
    tracemalloc.start()
    try:
        t = AffinityTable(max_entries=10_000, ttl_s=100)
        base = tracemalloc.get_traced_memory()[0]
        for i in range(100_000):
            t.put(i.to_bytes(8, "big"), "mymodel/standard/3")
        used = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert len(t) == 10_000
    assert used < 10_000 * 400  # ~200 bytes per entry, bounded by max_entries
