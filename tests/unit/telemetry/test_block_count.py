"""Token counts cached per prefix block: exactly a full encode for any split, and turn N+1 of a
growing conversation encodes only its new blocks (counted in encoder calls and characters)."""

from __future__ import annotations

import random

import pytest

from gateway.common.blocks import block_spans
from gateway.telemetry import tokencount
from gateway.telemetry.block_count import BlockCounts, safe_cut

WORDS = ["lorem", "ipsum", "dolor", "  ", "\n", "42", "3.14159", "naïve", "日本語テキスト",
         "don't", "it's", "'ll", "--", "...", "\t", "x=1;", "Ωμέγα", "😀", "  \n ", "1234567"]


def _text(rng: random.Random, n_words: int) -> str:
    return "".join(rng.choice(WORDS) + rng.choice(["", " ", " ", "  "]) for _ in range(n_words))


@pytest.mark.parametrize("encoding", ["cl100k_base", "o200k_base"])
@pytest.mark.parametrize("seed", range(6))
def test_block_count_equals_a_full_encode_for_random_splits(encoding: str, seed: int) -> None:
    rng = random.Random(seed)
    enc = tokencount.get_encoding(encoding)  # type: ignore[arg-type]
    counts = BlockCounts(block_chars=rng.choice([64, 100, 257, 1000]))
    whole = _text(rng, 3000)
    cuts = sorted(rng.sample(range(1, len(whole)), 12))
    texts = [whole[a:b] for a, b in zip([0, *cuts], [*cuts, len(whole)], strict=True)]
    want = [len(enc.encode_ordinary(t)) for t in texts]
    for turn in range(1, len(texts) + 1):  # the conversation grows text by text
        got = counts.count(encoding, texts[:turn], lambda t: len(enc.encode_ordinary(t)))
        assert got == sum(want[:turn])
    # one text growing in place (a completion prompt): every prefix counts exactly
    grow = BlockCounts(block_chars=rng.choice([64, 300]))
    for end in sorted(rng.sample(range(1, len(whole)), 8)):
        got = grow.count(encoding, [whole[:end]], lambda t: len(enc.encode_ordinary(t)))
        assert got == len(enc.encode_ordinary(whole[:end]))


def test_safe_cut_is_a_letter_then_a_space() -> None:
    assert safe_cut("ab cd ef", 0, 7) == 5  # "ab cd| ef"
    assert safe_cut("12 34 56", 0, 7) == 0  # digits before each space: none
    assert safe_cut("ab  cd", 0, 5) == 2  # the space after a space is not one
    assert safe_cut("ab cd", 2, 5) == 2  # nothing after lo


def _doc(turns: int) -> dict:
    msgs = [{"role": "system", "content": "You are an agent. " * 200}]
    for i in range(turns):
        msgs += [{"role": "user", "content": f"tool result {i}: " + "lorem ipsum dolor " * 3000},
                 {"role": "assistant", "content": f"step {i} " * 300}]
    return {"messages": msgs}


class _Counting:
    """An encoder that records the characters of every call, over the real one."""

    def __init__(self, real: object) -> None:
        self.real = real
        self.calls: list[int] = []

    def encode_ordinary(self, text: str) -> list[int]:
        self.calls.append(len(text))
        return self.real.encode_ordinary(text)  # type: ignore[attr-defined]


def test_turn_n_plus_1_encodes_only_its_new_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    real = tokencount.get_encoding()
    counting = _Counting(real)
    monkeypatch.setattr(tokencount, "BLOCKS", BlockCounts(block_chars=2048))
    monkeypatch.setattr(tokencount, "get_encoding", lambda name="cl100k_base": counting)
    first = tokencount.count_chat_prompt(_doc(20))
    chars_first = sum(counting.calls)
    counting.calls.clear()
    second = tokencount.count_chat_prompt(_doc(21))
    new = _doc(21)["messages"][-2:]
    new_chars = sum(len(m["role"]) + len(m["content"]) for m in new)
    # turn 21 encodes its own two messages (and their roles), nothing of turn 20's
    assert sum(counting.calls) == new_chars < chars_first / 10
    monkeypatch.setattr(tokencount, "get_encoding", lambda name="cl100k_base": real)
    tokencount.BLOCKS.clear()
    assert tokencount.count_chat_prompt(_doc(21)) == second  # same as a fresh count
    assert tokencount.count_chat_prompt(_doc(20)) == first


def test_a_growing_prompt_string_encodes_only_its_tail(monkeypatch: pytest.MonkeyPatch) -> None:
    real = tokencount.get_encoding()
    counting = _Counting(real)
    monkeypatch.setattr(tokencount, "BLOCKS", BlockCounts(block_chars=1024))
    monkeypatch.setattr(tokencount, "get_encoding", lambda name="cl100k_base": counting)
    base = "the quick brown fox jumps over the lazy dog " * 5000  # 220k characters
    n1 = tokencount.count_completion_prompt({"prompt": base})
    counting.calls.clear()
    n2 = tokencount.count_completion_prompt({"prompt": base + "and then some more words " * 40})
    assert sum(counting.calls) < 2 * 1024 + 1000  # the last cached block's tail and the new text
    assert n2 == len(real.encode_ordinary(base + "and then some more words " * 40))
    assert n1 == len(real.encode_ordinary(base))


def test_cache_is_bounded_lru_and_keyed_by_encoding() -> None:
    counts = BlockCounts(max_entries=3, block_chars=64)
    calls: list[str] = []

    def length(text: str) -> int:
        calls.append(text)
        return len(text)

    a, b = ["aaaa"], ["bbbb"]
    counts.count("cl100k_base", a, length)
    counts.count("cl100k_base", b, length)
    counts.count("cl100k_base", a, length)
    assert calls == ["aaaa", "bbbb"] and len(counts) == 2  # a reused
    counts.count("o200k_base", a, length)
    assert calls[-1] == "aaaa"  # another encoding: its own chain
    counts.count("cl100k_base", ["cccc"], length)
    assert len(counts) == 3
    calls.clear()
    counts.count("cl100k_base", b, length)  # b was least recently used: evicted
    assert calls == ["bbbb"]
    with pytest.raises(ValueError):
        BlockCounts(max_entries=0)


@pytest.mark.parametrize("encoding", ["cl100k_base", "o200k_base"])
@pytest.mark.parametrize(("base", "more"), [
    ("ab " * 21 + "a", "bc def"),  # a word cut by the block's end
    ("1" * 64, "23"),  # a digit run (three per pre-token)
    ("x" * 63 + "'", "s ok"),  # a contraction across the block's end
])
def test_a_text_of_whole_blocks_that_grows_counts_exactly(
    encoding: str, base: str, more: str
) -> None:
    """A text ending exactly at a block's end shares that block's hash with the same text
    grown: its entry must not claim the text's end as a safe cut."""
    enc = tokencount.get_encoding(encoding)  # type: ignore[arg-type]

    def length(t: str) -> int:
        return len(enc.encode_ordinary(t))

    counts = BlockCounts(block_chars=64)
    assert len(base) == 64
    assert counts.count(encoding, [base], length) == length(base)
    assert counts.count(encoding, [base + more], length) == length(base + more)
    assert counts.count(encoding, [base, more], length) == length(base) + length(more)


def test_an_entry_that_does_not_fit_its_block_is_not_trusted() -> None:
    """What a hash collision would look up (an entry recorded for another text index, or a
    cut past the block): ignored, the count is a full encode's, never an IndexError."""
    enc = tokencount.get_encoding("cl100k_base")

    def length(t: str) -> int:
        return len(enc.encode_ordinary(t))

    counts = BlockCounts(block_chars=64)
    texts = ["hello there", "general kenobi"]
    keys = [key for *_, key in block_spans(texts, 64, 1 << 62, b"cl100k_base")]
    counts._entries[keys[-1]] = (999, 7, 3)  # another conversation's text 7
    counts._entries[keys[0]] = (999, 0, 500)  # a cut past the block's end
    assert counts.count("cl100k_base", texts, length) == length(texts[0]) + length(texts[1])


DENSE = ["日本語テキスト", "，", "。", "漢字", "42", "3.14", "x=1;", "foo(bar)", "don't", "Ωμέγα",
         "naïve", "😀", "---", "'s", "é", "\u0301", "١٢٣", "ǅ", "ABC", "abc", "[]", "a1b2",
         "1234567890" * 30, "7" * 301, "漢" * 200]


@pytest.mark.parametrize("encoding", ["cl100k_base", "o200k_base"])
@pytest.mark.parametrize("seed", range(6))
def test_text_without_spaces_is_cut_by_class_and_still_counted_exactly(
    encoding: str, seed: int
) -> None:
    """CJK prose, code and numbers have no letter-then-space: they are cut where the class
    changes (a letter then a digit or punctuation...), and every count stays a full encode's."""
    rng = random.Random(seed)
    enc = tokencount.get_encoding(encoding)  # type: ignore[arg-type]
    whole = "".join(rng.choice(DENSE) for _ in range(1500))
    counts = BlockCounts(block_chars=rng.choice([64, 100, 257]))
    calls: list[int] = []

    def encode_len(t: str) -> int:
        calls.append(len(t))
        return len(enc.encode_ordinary(t))

    for end in [*sorted(rng.sample(range(1, len(whole)), 6)), len(whole)]:
        assert counts.count(encoding, [whole[:end]], encode_len) == len(
            enc.encode_ordinary(whole[:end]))
    assert max(calls) < 1000  # cut inside: no call took the whole text


def test_safe_cut_without_spaces_takes_a_change_of_class() -> None:
    assert safe_cut("漢字，漢字", 0, 4) == 2  # letter | punctuation
    assert safe_cut("abc123", 0, 5) == 3  # letter | digit
    assert safe_cut("123abc", 0, 5) == 3  # digit | letter
    assert safe_cut(",,,abc", 0, 5) == 0  # punctuation | letter: ",abc" is one pre-token
    assert safe_cut("don't", 0, 4) == 0  # o200k keeps "don't" whole
    assert safe_cut("x=1", 0, 2) == 2  # punctuation | digit
    assert safe_cut("1234567", 0, 6) == 6  # "123" "456" | "7"
    assert safe_cut("1234567", 3, 5) == 3  # from a cut at 3: the next one is at 6
    assert safe_cut("12345 ", 0, 5) == 3  # whole groups of three from the cut
