"""Token counts of long texts remembered by content, so a growing conversation is counted
incrementally: turn N+1 of a session re-sends every earlier message, and only its new
messages are encoded again.

Keyed by ``(encoding name, BLAKE2b-128 of the UTF-8 text)``: hashing runs at ~1 GB/s against
tiktoken's ~15-30 MB/s (``tokencount`` module docstring), so a 1M-token conversation whose
messages were all seen costs a few ms instead of ~0.3 s. Only texts of at least
``MIN_CHARS`` characters are remembered (short ones are cheaper to encode than to look up);
at most ``MAX_ENTRIES`` counts are kept, least recently used evicted first. Thread-safe
(counting runs in worker threads for large inputs).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable

MIN_CHARS = 2048
MAX_ENTRIES = 65_536  # ~100 bytes each: ~6.5 MB at most


class CountMemo:
    """An LRU of ``(encoding, text digest) → tokens``."""

    def __init__(self, max_entries: int = MAX_ENTRIES, min_chars: int = MIN_CHARS) -> None:
        self.max_entries = max_entries
        self.min_chars = min_chars
        self._counts: OrderedDict[tuple[str, bytes], int] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def count(self, encoding: str, text: str, encode_len: Callable[[str], int]) -> int:
        """Tokens of ``text`` under ``encoding``: remembered, or ``encode_len(text)`` (then
        remembered when ``text`` is long enough)."""
        if len(text) < self.min_chars:
            return encode_len(text)
        key = (encoding, hashlib.blake2b(text.encode("utf-8", "surrogatepass"),
                                         digest_size=16).digest())
        with self._lock:
            n = self._counts.get(key)
            if n is not None:
                self._counts.move_to_end(key)
                self.hits += 1
                return n
        n = encode_len(text)
        with self._lock:
            self.misses += 1
            self._counts[key] = n
            if len(self._counts) > self.max_entries:
                self._counts.popitem(last=False)
        return n

    def clear(self) -> None:
        """Forget every count."""
        with self._lock:
            self._counts.clear()
            self.hits = self.misses = 0
