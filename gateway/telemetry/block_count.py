"""Token counts cached per prefix block, so a growing conversation is counted incrementally:
turn N+1 of a session resends every earlier text, and only its new blocks are encoded.

The texts are cut into the blocks routing hashes (``gateway.common.blocks``, ``block_chars``
characters each, 2048 by default like a pool's ``routing.chunk_chars``). Each block's entry,
keyed by its chain hash (which covers the whole conversation up to the block's end), holds the
cumulative count of every text before it plus the tokens of its own text up to a **safe cut**
inside the block. A count looks up the deepest cached block (scanning back from the last one, so
turn N+1 with k new blocks costs k + 1 lookups), then encodes only the rest, segment by segment,
recording each new block.

A safe cut is a position ``p`` with a letter at ``p - 1`` and a space at ``p``: no pre-token of
tiktoken's ``cl100k_base`` or ``o200k_base`` split regex (``tokencount._SPECS``) spans a letter
followed by a space, and neither has a look-behind, so encoding ``text[:p]`` and ``text[p:]``
apart yields exactly the tokens of ``text`` (BPE never merges across pre-tokens). In a block
without one (CJK prose, code, numbers) a change of class serves, none of which a pre-token spans
in either regex: a letter (``\\p{L}``) then a digit (``\\p{N}``), a digit then a letter (a
word's optional lead character is never a digit), a letter or digit then punctuation or a
symbol (Unicode P*, S*: a word ends before it, its contractions start with the ASCII
apostrophe, which is left out), punctuation then a digit. A block with no such position (one
run of letters, punctuation or spaces) is carried into the next segment: still exact, only less
incremental. A run of digits is cut every three digits from its start (both regexes take
``\\p{N}{1,3}`` from the left). ``tests/unit/telemetry/test_block_count.py`` checks equality
with a full encode on random texts and splits.

Hashing runs at ~1 GB/s against tiktoken's ~15-30 MB/s (``tokencount`` module docstring), so a
1M-token conversation whose blocks were all seen costs a few ms instead of ~0.3 s
(``loadtests/bench_token_count.py``). Bounded: at most ``max_entries`` blocks (an entry is ~200
bytes: 131,072 entries ≈ 26 MB, 64 sessions of 1M tokens), least recently used evicted first.
Thread-safe (large counts run in worker threads).

Bounded: ``count_upto`` stops as soon as the tokens counted so far plus a lower bound of the
text not yet encoded (its characters divided by the most characters one token covers, rounded
up) exceed a limit, so a prompt longer than any replica takes costs the encoding of about
``limit`` tokens, not of the whole prompt.
"""

from __future__ import annotations

import threading
import unicodedata
from collections import OrderedDict
from collections.abc import Callable

from gateway.common.blocks import block_spans

MAX_ENTRIES = 131_072
BLOCK_CHARS = 2048
_NO_LIMIT = 1 << 62


def _kind(c: str) -> str:
    """``L`` (a letter, ``\\p{L}``), ``N`` (``\\p{N}``), ``P`` (punctuation or a symbol, the
    ASCII apostrophe aside) or ``-`` (anything else: space, mark, control)."""
    if c.isalpha():
        return "L"
    cat = unicodedata.category(c)[0]
    if cat == "N":
        return "N"
    return "P" if cat in "PS" and c != "'" else "-"


#: Pairs (character before, character after) that no pre-token of either encoding spans
#: (module docstring), besides a letter then a space.
_CUT_PAIRS = frozenset({"LN", "NL", "LP", "NP", "PN"})


def safe_cut(text: str, lo: int, hi: int, after: int = 0) -> int:
    """The last safe cut ``p`` of ``text`` with ``lo < p <= hi`` and ``p < len(text)`` (module
    docstring), or ``lo`` when there is none: a letter then a space if there is one, else a
    change of class (text without spaces: CJK prose, code), else a multiple of 3 digits into a
    run of digits that starts at ``lo``. ``lo`` must be a cut itself (0 or an earlier safe
    cut); ``after``: positions up to it are known to hold none (an earlier block's search),
    so only ``max(lo, after) < p`` are searched and a long text costs one pass."""
    low = max(lo, after)
    top = min(hi, len(text) - 1)
    p = text.rfind(" ", low + 1, top + 1)
    while p > low:
        if text[p - 1].isalpha():
            return p
        p = text.rfind(" ", low + 1, p)
    if top <= low:
        return lo
    following = _kind(text[top])
    for p in range(top, low, -1):
        before = _kind(text[p - 1])
        if before + following in _CUT_PAIRS:
            return p
        following = before
    run = lo  # both regexes group a run of digits by threes from its first one
    while run <= top and _kind(text[run]) == "N":
        run += 1
    p = lo + (min(run, top) - lo) // 3 * 3
    return p if p > low else lo


class BlockCounts:
    """An LRU of ``block chain hash → (cumulative tokens, text index, cut offset)``, one chain
    per encoding (the encoding name seeds the chain)."""

    def __init__(self, max_entries: int = MAX_ENTRIES, block_chars: int = BLOCK_CHARS) -> None:
        if max_entries < 1 or block_chars < 64:
            raise ValueError("max_entries must be >= 1 and block_chars >= 64")
        self.max_entries = max_entries
        self.block_chars = block_chars
        self._entries: OrderedDict[bytes, tuple[int, int, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0  # blocks whose count was reused
        self.misses = 0  # blocks encoded

    def __len__(self) -> int:
        return len(self._entries)

    def count(self, encoding: str, texts: list[str], encode_len: Callable[[str], int]) -> int:
        """Sum of ``encode_len(t)`` over ``texts`` (tokens under ``encoding``), encoding only the
        blocks no earlier count recorded."""
        return self.count_upto(encoding, texts, encode_len)[0]

    def count_upto(
        self, encoding: str, texts: list[str], encode_len: Callable[[str], int],
        limit: int | None = None, token_chars: int = 1,
    ) -> tuple[int, bool]:
        """``(tokens, stopped)``: ``count``'s sum, or, when ``limit`` is given, a stop as soon as
        the tokens counted plus ``ceil(characters not yet encoded / token_chars)`` exceed
        ``limit``; then ``stopped`` is True and ``tokens`` is that sum: more than ``limit``,
        at least what was counted, and a lower bound of the full count when no token of the
        encoding covers more than ``token_chars`` characters (``tokencount.max_token_chars``).
        The blocks encoded before a stop are recorded like any others."""
        total = sum(map(len, texts))
        bound = _NO_LIMIT if limit is None else limit
        if -(-total // token_chars) > bound:  # the characters alone prove it
            return -(-total // token_chars), True
        spans = list(block_spans(texts, self.block_chars, _NO_LIMIT, encoding.encode()))
        start, cum, idx, cut = 0, 0, 0, 0
        with self._lock:
            for j in range(len(spans) - 1, -1, -1):
                got = self._entries.get(spans[j][3])
                # an entry is of this block's text and cuts inside it; one that is not can
                # only be a hash collision (8-byte digests): not trusted, counted afresh
                if got is not None and got[1] == spans[j][0] and got[2] <= spans[j][2]:
                    self._entries.move_to_end(spans[j][3])
                    cum, idx, cut = got
                    start = j + 1
                    break
            self.hits += start
        before = [0]  # characters of the texts before each
        for piece in texts:
            before.append(before[-1] + len(piece))
        new: list[tuple[bytes, tuple[int, int, int]]] = []
        stopped = False
        for j in range(start, len(spans)):
            rest = total - before[idx] - cut
            if cum + -(-rest // token_chars) > bound:
                cum, stopped = cum + -(-rest // token_chars), True
                break
            t, begin, end, key = spans[j]
            if t != idx:  # the rest of the previous text, then a fresh one
                if cut < len(texts[idx]):
                    cum += encode_len(texts[idx][cut:])
                idx, cut = t, 0
            text = texts[t]
            # a short block ends its text in every conversation sharing its hash; a full one
            # that ends the text here may be followed by more of it in another: cut safely
            short = end - begin < self.block_chars
            c = len(text) if short and end >= len(text) else safe_cut(text, cut, end, begin)
            if c > cut:
                cum += encode_len(text[cut:c])
                cut = c
            new.append((key, (cum, idx, cut)))
        if not stopped and idx < len(texts) and cut < len(texts[idx]):
            cum += encode_len(texts[idx][cut:])
        if new:
            with self._lock:
                self.misses += len(new)
                for key, entry in new:
                    self._entries[key] = entry
                while len(self._entries) > self.max_entries:
                    self._entries.popitem(last=False)
        return cum, stopped

    def clear(self) -> None:
        """Forget every count."""
        with self._lock:
            self._entries.clear()
            self.hits = self.misses = 0
