"""Incremental token counting: turn N+1 of a growing conversation encodes only its new
messages, and the counts stay exactly what a fresh count gives."""

from __future__ import annotations

import pytest

from gateway.telemetry import tokencount
from gateway.telemetry.token_memo import CountMemo


def _doc(turns: int) -> dict:
    msgs = [{"role": "system", "content": "You are an agent. " * 200}]
    for i in range(turns):
        msgs += [{"role": "user", "content": f"tool result {i}: " + "lorem ipsum dolor " * 3000},
                 {"role": "assistant", "content": f"step {i} " * 300}]
    return {"messages": msgs}


def test_turn_n_plus_1_encodes_only_the_new_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    memo = CountMemo()
    monkeypatch.setattr(tokencount, "MEMO", memo)
    enc = tokencount.get_encoding()
    encoded: list[int] = []
    real = enc.encode_ordinary

    class Counting:
        def encode_ordinary(self, text: str) -> list[int]:
            encoded.append(len(text))
            return real(text)

    monkeypatch.setattr(tokencount, "get_encoding", lambda name="cl100k_base": Counting())
    first = tokencount.count_chat_prompt(_doc(20))
    chars_first = sum(encoded)
    encoded.clear()
    second = tokencount.count_chat_prompt(_doc(21))
    new_chars = len(_doc(21)["messages"][-2]["content"]) + len(_doc(21)["messages"][-1]["content"])
    # of the long texts, only turn 21's two messages (roles and other short strings are
    # cheaper to encode than to look up)
    assert sum(n for n in encoded if n >= memo.min_chars) == new_chars < chars_first / 10
    monkeypatch.setattr(tokencount, "get_encoding", lambda name="cl100k_base": enc)
    memo.clear()
    assert tokencount.count_chat_prompt(_doc(21)) == second  # same as a fresh count
    assert tokencount.count_chat_prompt(_doc(20)) == first


def test_memo_is_bounded_and_keyed_by_encoding() -> None:
    memo = CountMemo(max_entries=2, min_chars=4)
    calls: list[str] = []

    def length(text: str) -> int:
        calls.append(text)
        return len(text)

    for t in ("aaaa", "bbbb", "aaaa", "cccc", "bbbb"):
        memo.count("cl100k_base", t, length)
    assert calls == ["aaaa", "bbbb", "cccc", "bbbb"]  # bbbb was evicted (LRU), aaaa kept
    memo.count("o200k_base", "aaaa", length)
    assert calls[-1] == "aaaa"  # another encoding: its own count
    assert memo.count("x", "ab", length) == 2 and calls[-1] == "ab"  # short: never cached

