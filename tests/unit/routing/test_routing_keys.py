"""Session keys and prefix block chains (gateway.routing.keys)."""

import asyncio
import time

import orjson

from gateway.routing.keys import (
    RouteRequest,
    block_chain,
    message_texts,
    sampled_indices,
    session_key,
)
from loadtests._common import long_chat_body


def _conv(turns: int) -> dict:
    msgs = [{"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "Fix the failing test in repo X."}]
    for i in range(turns):
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": "run", "arguments": "{}"}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"output {i} " * 700})
    return {"model": "m", "messages": msgs}


def test_turn_n_plus_1_shares_all_blocks_of_turn_n():
    a = block_chain(message_texts(_conv(3)), 1024, 1 << 30)
    b = block_chain(message_texts(_conv(4)), 1024, 1 << 30)
    assert len(b) > len(a) > 6
    assert b[: len(a)] == a  # every block of turn N, then only the new ones
    assert len(set(b)) == len(b)


def test_long_messages_are_cut_in_chunks_and_a_change_breaks_the_chain_after_it():
    doc = {"messages": [{"role": "user", "content": "x" * 5000}]}
    assert len(block_chain(message_texts(doc), 1000, 1 << 30)) == 6  # "user\0" + 5000 chars
    other = {"messages": [{"role": "user", "content": "x" * 2500 + "y" + "x" * 2499}]}
    a = block_chain(message_texts(doc), 1000, 1 << 30)
    b = block_chain(message_texts(other), 1000, 1 << 30)
    assert a[:2] == b[:2] and a[2] != b[2] and a[5] != b[5]


def test_hashing_cap_and_stability_across_processes():
    doc = _conv(10)
    capped = block_chain(message_texts(doc), 512, 4096)
    full = block_chain(message_texts(doc), 512, 1 << 30)
    assert 0 < len(capped) < len(full) and full[: len(capped)] == capped
    # BLAKE2b, not Python's salted hash(): the same bytes on every gateway replica
    h = block_chain(["user\x00hi"], 64, 100)[0]
    assert len(h) == 8 and h == block_chain(["user\x00hi"], 64, 100)[0]


def test_session_key_header_first_else_leading_messages():
    d3, d4 = _conv(3), _conv(4)
    assert session_key(d3, "s1") == "h:s1"
    assert session_key(d3, None) == session_key(d4, None)  # later turns: same leading messages
    other = _conv(3)
    other["messages"][1]["content"] = "another task"
    assert session_key(other, None) != session_key(d3, None)
    assert session_key({"prompt": "abc"}, None) == session_key({"prompt": "abc"}, None)


def test_sampled_indices_find_blocks_recorded_by_the_previous_turn():
    prev, cur = 300, 310
    recorded = set(sampled_indices(prev))
    looked = sampled_indices(cur)
    assert looked == sorted(looked, reverse=True)
    assert prev - 1 in looked and prev - 1 in recorded  # the deepest shared block is found
    assert set(looked) & recorded
    assert len(sampled_indices(100_000)) <= 100_000 // 16 + 33


def test_5mib_conversation_hashes_fast_and_off_the_loop():
    doc = orjson.loads(long_chat_body("m", 5.0))
    t0 = time.perf_counter()
    route = RouteRequest.from_doc(doc, None)
    on_loop_s = time.perf_counter() - t0
    chain = asyncio.run(route.chain(2048, 16 << 20))  # > 256 KiB: hashed in a worker thread
    assert len(chain) > 2000
    assert on_loop_s < 0.5  # measured ~3 ms; generous for a shared CI machine
