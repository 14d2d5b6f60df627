"""A prompt that cannot fit is counted only up to the limit: refused by its length alone when
its characters prove it (nothing encoded), else once the tokens counted pass the limit; the
count returned is then a lower bound above the limit, never below what was counted, and the
memory the count takes stays flat whatever the prompt's size."""

from __future__ import annotations

import tracemalloc

import pytest

from gateway.telemetry import tokencount
from gateway.telemetry.block_count import BlockCounts

SENTENCE = "The quick brown fox jumps over the lazy dog, then reads the build log again. "


class _Counting:
    """An encoder that records the characters of every call, over the real one."""

    def __init__(self, real: object) -> None:
        self.real = real
        self.chars = 0

    def encode_ordinary(self, text: str) -> list[int]:
        self.chars += len(text)
        return self.real.encode_ordinary(text)  # type: ignore[attr-defined]


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> _Counting:
    enc = _Counting(tokencount.get_encoding())
    monkeypatch.setattr(tokencount, "BLOCKS", BlockCounts())
    monkeypatch.setattr(tokencount, "get_encoding", lambda name="cl100k_base": enc)
    return enc


def _chat(text: str) -> dict:
    return {"messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": text}]}


@pytest.mark.parametrize("encoding", ["cl100k_base", "o200k_base"])
def test_longest_token_bounds_the_characters_per_token(encoding: str) -> None:
    assert tokencount.max_token_chars(encoding) == 128  # type: ignore[arg-type]


@pytest.mark.parametrize("text", [
    "The quick brown fox. " * 400_000,  # 8 MiB of English
    "漢字かな交じり文の長い文書です" * 100_000,  # 1.5 M characters, 4.5 MB: one run of letters
])
def test_a_prompt_longer_than_any_context_by_its_bytes_is_not_encoded(
    counting: _Counting, text: str
) -> None:
    """Against a 32k-token context: 128 × 32,768 bytes = 4 MiB hold at least 32,768 tokens
    (a token is at most 128 bytes), so more is refused before any encoding. The CJK run has
    no cut inside: counted, it was encoded whole (4.5 s and ~300 MB for 8 MiB)."""
    got = tokencount.count_prompt_upto(_chat(text), "chat", 32768)
    assert got.stopped and got.tokens > 32768
    assert got.tokens >= len(text.encode()) // 128
    assert counting.chars == 0


def test_counting_stops_once_past_the_limit(counting: _Counting) -> None:
    text = SENTENCE * 8000  # 608k characters, ~136k tokens: more than 32k by its count only
    assert len(text) // 128 < 32768
    got = tokencount.count_prompt_upto(_chat(text), "chat", 32768)
    assert got.stopped and got.tokens > 32768
    # about 32k tokens' worth of text encoded (~4.5 characters a token), not 608k characters
    assert counting.chars < 32768 * 5 + 2 * 2048
    full = len(tokencount.get_encoding().encode_ordinary(text))
    assert got.tokens <= full + 3 * 2 + 3 + 3  # a lower bound of the real count


def test_a_prompt_that_fits_is_counted_exactly(counting: _Counting) -> None:
    doc = _chat(SENTENCE * 100)
    got = tokencount.count_prompt_upto(doc, "chat", 32768)
    assert not got.stopped
    assert got.tokens == tokencount.count_chat_prompt(doc)
    n = tokencount.count_completion_prompt({"prompt": SENTENCE * 100})
    exact = tokencount.count_prompt_upto({"prompt": SENTENCE * 100}, "completion", n)
    assert not exact.stopped and exact.tokens == n  # at the limit: all of it
    over = tokencount.count_prompt_upto({"prompt": SENTENCE * 100}, "completion", n - 1)
    assert over.tokens > n - 1  # past it (stopped or not): refused either way


@pytest.mark.parametrize("text", [
    SENTENCE * 40_000,  # 3 MB of English: stops after ~32k tokens
    "漢字，かな。" * 200_000,  # 1.2 M characters of CJK prose: cut at its punctuation
    "1234567890" * 300_000,  # 3 MB of digits: cut every three digits
    "漢字かな交じり文の長い文書です" * 100_000,  # 4.5 MB of CJK letters: refused by its bytes
])
def test_memory_of_a_prompt_that_cannot_fit_stays_flat(text: str) -> None:
    """The count's own allocations (tracemalloc peak over the document already in memory):
    a few blocks' tokens, not the prompt's (a full count of each takes 25-110 MB)."""
    tokencount.get_encoding()
    doc = _chat(text)
    tracemalloc.start()
    try:
        got = tokencount.count_prompt_upto(doc, "chat", 32768)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got.stopped
    assert peak < 4 * 1024 * 1024


def test_admission_estimate_adds_the_output_cap_and_says_when_it_stopped(
    counting: _Counting,
) -> None:
    """``estimate_tokens_upto`` (fit at admission, a key's tokens per minute): the limit holds
    the prompt and the output cap together; past it the estimate is a lower bound."""
    import asyncio

    from gateway.plan.kv_fit import estimate_tokens, estimate_tokens_upto

    doc = {**_chat(SENTENCE * 8000), "max_tokens": 1000}
    got = asyncio.run(estimate_tokens_upto(doc, "chat", 700_000, "cl100k_base", 32768))
    assert got.stopped and got.tokens > 32768
    assert counting.chars < 32768 * 5 + 2 * 2048
    small = {**_chat("hello there"), "max_tokens": 1000}
    fits = asyncio.run(estimate_tokens_upto(small, "chat", 100, "cl100k_base", 32768))
    assert not fits.stopped
    assert fits.tokens == asyncio.run(estimate_tokens(small, "chat", 100, "cl100k_base"))
    assert fits.tokens == tokencount.count_chat_prompt(small) + 1000
