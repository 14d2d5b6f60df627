"""The sessions table: bounded LRU, per-session totals, decayed rates with documented units."""

from __future__ import annotations

import math

import pytest

from gateway.console.sessions import MAX_ID_CHARS, SessionTable, clip_id


def test_totals_cached_share_and_tiers() -> None:
    t = SessionTable(10)
    t.observe("k1", "s1", 0.0, tier="fast", ok=True, prompt=1000, cached=800, completion=50,
              cost_usd=0.002)
    t.observe("k1", "s1", 1.0, tier="standard", ok=False)
    row = t.top(1.0, 60, 5, "requests_per_min")[0].to_dict(1.0, 1_000_001.0)
    assert row["session_id"] == "s1" and row["key_id"] == "k1"
    assert (row["turns"], row["errors"], row["prompt_tokens"], row["cached_tokens"]) == (2, 1, 1000,
                                                                                         800)
    assert row["cached_share"] == 0.8 and row["cost_usd"] == 0.002
    assert row["tiers"] == {"fast": 1, "standard": 1}
    assert row["first_seen"] == 1_000_000.0 and row["last_seen"] == 1_000_001.0  # unix s


def test_same_session_id_under_two_keys_is_two_sessions() -> None:
    t = SessionTable(10)
    t.observe("a", "s", 0.0, tier="fast", ok=True)
    t.observe("b", "s", 0.0, tier="fast", ok=True)
    assert len(t) == 2


def test_steady_rate_reads_back_in_requests_per_minute_and_usd_per_hour() -> None:
    """A session making one $0.01 request every 2 s for 10 half-lives reads ~30 req/min and
    ~$18/h (the decayed count's fixed point c = r·h/ln 2 after the sawtooth's mean)."""
    t = SessionTable(10, half_life_s=60.0)
    now = 0.0
    while now < 600.0:
        s = t.observe(None, "steady", now, tier="fast", ok=True, cost_usd=0.01)
        now += 2.0
    mid = now - 1.0  # halfway between two requests: the sawtooth's mean
    assert s.requests_per_min(mid) == pytest.approx(30.0, rel=0.02)
    assert s.usd_per_hour(mid) == pytest.approx(18.0, rel=0.02)
    # a quiet session fades: one half-life later, half the rate
    assert s.requests_per_min(mid + 60.0) == pytest.approx(s.requests_per_min(mid) / 2)


def test_bounded_least_recently_seen_evicted_first() -> None:
    t = SessionTable(100)
    for i in range(1000):
        t.observe(None, f"s{i}", float(i), tier="standard", ok=True)
        if i % 10 == 0:
            t.observe(None, "hot", float(i), tier="standard", ok=True)  # stays recent
    assert len(t) == 100 and t.evicted == 1001 - 100
    ids = {s.session_id for s in t.active(1000.0, 10_000)}
    assert "hot" in ids and "s0" not in ids and "s999" in ids


def test_top_rankings_and_active_window() -> None:
    t = SessionTable(100)
    t.observe(None, "old", 0.0, tier="fast", ok=True, cost_usd=50.0)
    for i in range(5):
        t.observe(None, "busy", 100.0 + i, tier="fast", ok=True, cost_usd=0.0001)
    t.observe(None, "pricey", 104.0, tier="fast", ok=True, cost_usd=1.0)
    now = 105.0
    assert [s.session_id for s in t.top(now, 60, 2, "requests_per_min")] == ["busy", "pricey"]
    assert [s.session_id for s in t.top(now, 60, 2, "usd_per_hour")] == ["pricey", "busy"]
    assert "old" not in {s.session_id for s in t.active(now, 60)}  # not active now
    with pytest.raises(ValueError):
        t.top(now, 60, 2, "name")


def test_long_session_ids_are_cut() -> None:
    long = "x" * 10_000
    assert clip_id(long) is not None and len(clip_id(long) or "") == MAX_ID_CHARS
    assert clip_id("short") == "short" and clip_id(None) is None
    t = SessionTable(10)
    s = t.observe(None, long, 0.0, tier=None, ok=True)
    assert len(s.session_id) == MAX_ID_CHARS and s.session_id.endswith("…")
    assert math.isclose(s.requests_per_min(0.0), math.log(2) / 60 * 60)


def test_trees_roll_up_subagents_and_ended_rows_say_how() -> None:
    from gateway.console.sessions import recently_ended, session_trees

    t = SessionTable(10)
    t.observe("k", "main", 0.0, tier="fast", ok=True, prompt=100, completion=10, cost_usd=0.01)
    t.observe("k", "main/agent/a", 1.0, tier="fast", ok=True, prompt=50, completion=5,
              cost_usd=0.004, parent="main")
    t.observe("k", "main/agent/b", 2.0, tier="fast", ok=True, prompt=20, completion=2,
              cost_usd=0.001, parent="main/agent/a")
    t.observe("k", "solo", 3.0, tier="fast", ok=True, cost_usd=1.0)
    t.observe("other", "main/agent/x", 3.0, tier="fast", ok=True, parent="main")  # other key
    trees = session_trees(t.active(3.0, 60), 5, 3.0, 1000.0)
    assert [x["session_id"] for x in trees] == ["main"]  # "solo" has no subagent
    main = trees[0]
    assert main["turns"] == 1 and main["total"] == {
        "turns": 3, "prompt_tokens": 170, "completion_tokens": 17, "cost_usd": 0.015}
    (a,) = main["children"]
    assert a["parent_session_id"] == "main" and a["total"]["turns"] == 2
    assert [c["session_id"] for c in a["children"]] == ["main/agent/b"]
    t.end("k", "main/agent/a", "explicit")
    t.end("k", "solo", "idle")
    t.end("k", "never-seen", "idle")  # not in the table: nothing
    assert [(r["session_id"], r["ended"]) for r in recently_ended(t.active(3.0, 60), 5, 3.0,
                                                                  1000.0)] == [
        ("solo", "idle"), ("main/agent/a", "explicit")]
    t.observe("k", "solo", 4.0, tier="fast", ok=True)  # a turn after its end: it goes on
    assert recently_ended(t.active(4.0, 60), 5, 4.0, 1000.0)[0]["session_id"] == "main/agent/a"


def test_a_long_chain_of_subagents_is_one_bounded_tree() -> None:
    """A key whose 3,000 sessions each name the one before as parent: one tree, listed four
    levels deep, its total over the whole chain, built in linear time (it raised
    RecursionError, which failed the console's snapshot, after a quadratic scan: 4.6 s for
    5,000)."""
    import json
    import time

    from gateway.console.sessions import MAX_TREE_DEPTH, session_trees

    n = 3000
    t = SessionTable(10_000)
    for i in range(n):
        t.observe("k", f"s{i}", 1.0, tier="fast", ok=True, prompt=1,
                  parent=f"s{i - 1}" if i else None)
    t0 = time.perf_counter()
    (tree,) = session_trees(t.active(1.0, 60), 5, 1.0, 1000.0)
    assert time.perf_counter() - t0 < 1.0
    assert tree["session_id"] == "s0" and tree["total"]["turns"] == n
    depth, row = 0, tree
    while row["children"]:
        (row,) = row["children"]
        depth += 1
    assert depth == MAX_TREE_DEPTH and row["total"]["turns"] == n - MAX_TREE_DEPTH
    json.dumps(tree)  # the snapshot serialises
