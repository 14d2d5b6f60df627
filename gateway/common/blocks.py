"""Prefix blocks: a conversation's texts cut into fixed-size character pieces, each named by a
chain hash that covers every piece before it (like vLLM's prefix cache, ``hash(parent, block)``,
but over characters, without tokenizing).

Routing keys affinity by these hashes (``gateway.routing.keys.block_chain``) and the token
counter caches counts by them (``gateway.telemetry.block_count``): turn N+1 of a session resends
turn N's texts and appends new ones, so it shares every block of turn N and adds only its own.
Hashes are 8-byte BLAKE2b digests (stable across processes); a piece is marked as a text's start
(``\\x1e``) or a continuation (``\\x1f``), so text boundaries are part of the chain.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator


def block_spans(
    texts: list[str], chunk_chars: int, max_chars: int, seed: bytes = b""
) -> Iterator[tuple[int, int, int, bytes]]:
    """``(text index, start, end, chain hash)`` of each block of ``texts``, in order: each text
    cut in ``chunk_chars`` pieces (``[start, end)`` character offsets; an empty text is one empty
    block), block ``i``'s 8-byte hash covering blocks ``0..i`` and ``seed`` (the chain's
    namespace). Stops after ``max_chars`` characters."""
    parent = seed
    budget = max_chars
    blake = hashlib.blake2b
    for idx, text in enumerate(texts):
        n = len(text)
        for i in range(0, n or 1, chunk_chars):
            piece = text[i : i + chunk_chars]
            h = blake(parent, digest_size=8)
            h.update(b"\x1e" if i == 0 else b"\x1f")  # text start vs continuation
            h.update(piece.encode("utf-8", "surrogatepass"))
            parent = h.digest()
            yield idx, i, i + len(piece), parent
            budget -= len(piece)
            if budget <= 0:
                return
