"""Compressed request bodies (``Content-Encoding``), decoded incrementally within a bound.

Codings (RFC 9110 §8.4.1, the IANA content-coding registry): ``gzip`` (and ``x-gzip``),
``deflate`` (the zlib format, RFC 1950; a raw RFC 1951 stream, which some clients send under
that name, is accepted too), ``br`` (Brotli, RFC 7932, the ``brotli`` package), ``zstd`` (RFC
8878, the ``zstandard`` package); ``identity`` is no coding. ``Content-Encoding`` is read as
RFC 9110 §5.3 and §8.4 say: every field line of it joined into one comma-separated list, the
codings in the order they were applied, so decoded last to first; at most ``MAX_CODINGS`` of
them. Any other coding is ``UnsupportedMediaType`` (415).

Decoding is incremental and bounded: each received chunk is decoded as it arrives, and no
decoder ever produces more than ``limit + 1`` bytes in total, so a small "bomb" (a few KB
that would inflate to gigabytes) costs at most ``limit`` bytes of output and the compressed
bytes read so far are never held: ``BodyTooLarge`` (413) as soon as the decoded size passes
``limit``. zlib's ``decompressobj`` (``max_length``) and Brotli's ``Decompressor``
(``output_buffer_limit``) stop at the bound themselves; zstandard's ``decompressobj`` is fed
slices small enough that they cannot inflate past it (``ZstdDecoder``). A corrupt or truncated
stream is ``InvalidRequest`` (400, ``invalid_encoding``). A body that inflates past
``MAX_INFLATION``:1 (beyond the first ``INFLATION_FLOOR`` bytes) is refused (413) as it
decodes, so a bomb costs memory in proportion to its own compressed size, not to ``limit``.
Stacked codings keep that bound from the bytes received to the body decoded (``ChainDecoder``).

Off the event loop: ``decode_chunk`` decodes a received chunk of ``OFFLOAD_BYTES`` or more in a
worker thread (zlib, brotli and zstandard release the GIL while they decode), so a burst of
large compressed bodies does not stall the other requests' streams; a smaller chunk, whose
decoding costs well under a millisecond (module constant), is decoded inline.

The edges' entry points: ``body_decoder`` (every ``Content-Encoding`` field value in, a decoder
out), ``decode_chunk`` per received chunk, then ``BodyDecoder.finish``; ``decode_body`` does
all three for a body already received whole.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Iterable
from typing import Protocol

import brotli
import zstandard

from gateway.errors import BodyTooLarge, InvalidRequest, UnsupportedMediaType

#: The codings accepted, as they appear in ``Content-Encoding`` (lower-case).
CODINGS = ("gzip", "x-gzip", "deflate", "br", "zstd")
#: Most codings stacked on one body (RFC 9110 sets none; clients apply one): each is a decoder
#: holding up to ``limit`` bytes, so the number is bounded.
MAX_CODINGS = 3
#: Received chunks at least this long (bytes, compressed) are decoded in a worker thread. A
#: shorter chunk decodes to at most ~1 MiB (``MAX_INFLATION`` times its size, or what is left
#: of ``INFLATION_FLOOR``): measured 0.54 ms for the worst case (1 KiB of gzip'd zeros giving
#: 1 MiB) and ~5 µs for an ordinary chunk, against ~30 µs for a hand-off to a thread.
OFFLOAD_BYTES = 1024
_PIECE = 64 * 1024  # output produced per step (bytes)


class BodyDecoder(Protocol):
    """Decodes one body: ``feed`` each received chunk, then ``finish``; both return decoded
    bytes and raise ``BodyTooLarge`` once the total passes the decoder's limit."""

    def feed(self, data: bytes) -> bytes:
        """Decoded bytes of the next compressed chunk ``data``."""
        ...

    def finish(self) -> bytes:
        """The last decoded bytes; ``InvalidRequest`` when the stream is incomplete."""
        ...


def _too_large(limit: int) -> BodyTooLarge:
    return BodyTooLarge(f"decoded request body exceeds the limit of {limit} bytes")


def _corrupt(coding: str, e: Exception) -> InvalidRequest:
    return InvalidRequest(f"request body is not valid {coding} data: {e}",
                          code="invalid_encoding", param="content-encoding")


#: Most decoded bytes per compressed byte accepted past ``INFLATION_FLOOR``: JSON compresses
#: about 5-20:1 with gzip and rarely past 100:1 even when repetitive, while a "bomb" inflates
#: 1000:1 (deflate's own ceiling is ~1032:1, RFC 1951's longest match per 2 bits) and far more
#: nested. Past this ratio the body is refused (413) before it costs ``limit`` bytes of memory.
MAX_INFLATION = 1000
#: Decoded bytes always allowed whatever the ratio (a small body's header overhead).
INFLATION_FLOOR = 1024 * 1024


class _Budget:
    """Decoded bytes left before the limit or the inflation bound (``MAX_INFLATION`` times
    the compressed bytes fed so far, ``INFLATION_FLOOR`` at least); ``take`` refuses past
    either with ``BodyTooLarge`` (413). ``ceiling``: a stacked coding's stage is bounded by
    the whole chain's allowance too (the bytes received, not its own input), so no stage
    decodes more than the body may."""

    __slots__ = ("allowed", "ceiling", "fed_bytes", "left", "limit", "produced")

    def __init__(self, limit: int, ceiling: _Budget | None = None) -> None:
        self.limit, self.left, self.produced, self.fed_bytes = limit, 0, 0, 0
        self.allowed, self.ceiling = 0, ceiling
        self.fed(0)

    def fed(self, n: int) -> None:
        """``n`` more compressed bytes arrived: the allowance grows with them."""
        self.fed_bytes += n
        allowed = min(self.limit, max(INFLATION_FLOOR, MAX_INFLATION * self.fed_bytes))
        if self.ceiling is not None:
            allowed = min(allowed, self.ceiling.allowed)
        self.allowed = allowed
        self.left = allowed - self.produced

    def take(self, out: bytes) -> bytes:
        self.produced += len(out)
        self.left -= len(out)
        if self.left < 0:
            if self.produced > self.limit:
                raise _too_large(self.limit)
            fed = self.ceiling.fed_bytes if self.ceiling is not None else self.fed_bytes
            raise BodyTooLarge(
                f"request body inflates more than {MAX_INFLATION}:1 when decoded "
                f"({fed} compressed bytes gave over {self.produced})")
        return out


class ZlibDecoder:
    """``gzip`` (every member, RFC 1952 §2.2) or ``deflate`` (zlib or raw, told by the first
    two bytes: RFC 1950 §2.2)."""

    def __init__(self, coding: str, limit: int, ceiling: _Budget | None = None) -> None:
        self.coding, self.budget = coding, _Budget(limit, ceiling)
        self.obj: zlib._Decompress | None = None
        self.head = b""

    def _start(self, data: bytes) -> bytes:
        if self.coding != "deflate":
            self.obj = zlib.decompressobj(16 + zlib.MAX_WBITS)
            return data
        self.head += data
        if len(self.head) < 2:
            return b""
        cmf, flg = self.head[0], self.head[1]
        zlib_format = cmf & 0x0F == 8 and (cmf << 8 | flg) % 31 == 0
        self.obj = zlib.decompressobj(zlib.MAX_WBITS if zlib_format else -zlib.MAX_WBITS)
        data, self.head = self.head, b""
        return data

    def feed(self, data: bytes) -> bytes:
        self.budget.fed(len(data))
        if self.obj is None:
            data = self._start(data)
            if self.obj is None:
                return b""
        obj, parts = self.obj, []
        try:
            while data:
                # never more than the bytes left + 1: past that the body is refused anyway
                out = obj.decompress(data, min(_PIECE, self.budget.left + 1))
                parts.append(self.budget.take(out))
                data = obj.unconsumed_tail
                if obj.eof:
                    data = obj.unused_data
                    if not data or self.coding != "gzip":
                        break
                    obj = self.obj = zlib.decompressobj(16 + zlib.MAX_WBITS)  # next member
        except zlib.error as e:
            raise _corrupt(self.coding, e) from None
        return b"".join(parts)

    def finish(self) -> bytes:
        if self.obj is None:
            raise _corrupt(self.coding, ValueError("stream too short"))
        if not self.obj.eof:
            raise _corrupt(self.coding, ValueError("stream truncated"))
        return b""


class BrotliDecoder:
    """``br`` with Brotli's own output bound (``output_buffer_limit``, brotli ≥ 1.1)."""

    def __init__(self, limit: int, ceiling: _Budget | None = None) -> None:
        self.obj, self.budget = brotli.Decompressor(), _Budget(limit, ceiling)

    def feed(self, data: bytes) -> bytes:
        self.budget.fed(len(data))
        obj, parts = self.obj, []
        try:
            out = obj.process(data, output_buffer_limit=min(_PIECE, self.budget.left + 1))
            parts.append(self.budget.take(out))
            # past the output limit Brotli keeps the rest of the input inside (brotli 1.2:
            # can_accept_more_data() may already say True): drain until it gives nothing
            while out and not obj.is_finished():
                out = obj.process(b"", output_buffer_limit=min(_PIECE, self.budget.left + 1))
                parts.append(self.budget.take(out))
        except brotli.error as e:
            raise _corrupt("br", e) from None
        return b"".join(parts)

    def finish(self) -> bytes:
        if not self.obj.is_finished():
            raise _corrupt("br", ValueError("stream truncated"))
        return b""


#: Most bytes a zstd decoder emits per input byte: a block (≤ 128 KiB, RFC 8878 §3.1.1.2.4)
#: needs a 3-byte header and one byte of RLE content at least.
ZSTD_MAX_RATIO = 128 * 1024 // 4


class ZstdDecoder:
    """``zstd`` (every frame of the body decoded). zstandard's ``decompressobj`` has no output
    bound, so its input is cut in slices small enough that even a slice of RLE blocks
    (``ZSTD_MAX_RATIO``) cannot emit more than the bytes left (64 bytes at least: then at most
    2 MiB past the bound before the refusal)."""

    def __init__(self, limit: int, ceiling: _Budget | None = None) -> None:
        self.budget = _Budget(limit, ceiling)
        self.obj = zstandard.ZstdDecompressor().decompressobj()
        self.fed = False

    def feed(self, data: bytes) -> bytes:
        self.budget.fed(len(data))
        parts: list[bytes] = []
        view = memoryview(data)
        try:
            while view:
                n = max(64, (self.budget.left + 1) // ZSTD_MAX_RATIO)
                piece, view = view[:n], view[n:]
                if self.obj.eof:  # the next frame of a multi-frame body
                    self.obj = zstandard.ZstdDecompressor().decompressobj()
                parts.append(self.budget.take(self.obj.decompress(bytes(piece))))
                self.fed = True
                rest = self.obj.unused_data
                if rest:
                    self.obj = zstandard.ZstdDecompressor().decompressobj()
                    view = memoryview(rest + bytes(view))
        except zstandard.ZstdError as e:
            raise _corrupt("zstd", e) from None
        return b"".join(parts)

    def finish(self) -> bytes:
        if not (self.fed and self.obj.eof):
            raise _corrupt("zstd", ValueError("stream truncated"))
        return b""


def coding_list(content_encoding: str | Iterable[str] | None) -> list[str]:
    """The codings of ``Content-Encoding``: one field value or all of the request's field
    values (RFC 9110 §5.3: repeated field lines are one comma-separated list), in the order
    they were applied, lower-case, ``identity`` and empty members left out."""
    values = [content_encoding] if isinstance(content_encoding, str) else content_encoding or []
    codings = [c.strip().lower() for v in values for c in v.split(",")]
    return [c for c in codings if c and c != "identity"]


def _single(coding: str, limit: int, ceiling: _Budget | None = None) -> BodyDecoder:
    if coding == "br":
        return BrotliDecoder(limit, ceiling)
    if coding == "zstd":
        return ZstdDecoder(limit, ceiling)
    return ZlibDecoder("gzip" if coding == "x-gzip" else coding, limit, ceiling)


class ChainDecoder:
    """Stacked codings (``codings``, in the order applied; decoded from the last, the
    outermost). Each stage is bounded by ``limit`` as a single coding is and, through its
    budget's ceiling, by the chain's own allowance: ``MAX_INFLATION`` times the bytes
    received, so a bomb nested in several codings is refused like one in a single coding and
    no stage decodes more in between (a 272-byte ``gzip, gzip`` body decoded 8 MiB in its
    middle stage, ~8 ms, inline, before the chain refused it)."""

    def __init__(self, codings: list[str], limit: int) -> None:
        self.budget = _Budget(limit)
        self.decoders = [_single(c, limit, self.budget) for c in reversed(codings)]

    def feed(self, data: bytes) -> bytes:
        """Decoded bytes of the next received chunk ``data``, through every stage."""
        self.budget.fed(len(data))
        for d in self.decoders:
            data = d.feed(data) if data else b""
        return self.budget.take(data)

    def finish(self) -> bytes:
        """The last decoded bytes; ``InvalidRequest`` when any stage's stream is incomplete."""
        data = b""
        for d in self.decoders:
            data = (d.feed(data) if data else b"") + d.finish()
        return self.budget.take(data)


def body_decoder(content_encoding: str | Iterable[str] | None, limit: int) -> BodyDecoder | None:
    """The decoder of a request's ``Content-Encoding``: its field value, or all its field
    values in order (``coding_list``); None for no coding (absent, empty, ``identity``).
    ``UnsupportedMediaType`` (415) for an unknown coding or more than ``MAX_CODINGS``.
    ``limit``: the most decoded bytes accepted (``server.max_body_bytes``)."""
    codings = coding_list(content_encoding)
    if not codings:
        return None
    if len(codings) > MAX_CODINGS or any(c not in CODINGS for c in codings):
        shown = ", ".join(codings)
        raise UnsupportedMediaType(
            f"Content-Encoding {shown!r} is not supported: use gzip, deflate, br or zstd "
            f"(at most {MAX_CODINGS} stacked), or none", param="content-encoding")
    if len(codings) == 1:
        return _single(codings[0], limit)
    return ChainDecoder(codings, limit)


async def decode_chunk(decoder: BodyDecoder, chunk: bytes) -> bytes:
    """``decoder.feed(chunk)``, in a worker thread when ``chunk`` is ``OFFLOAD_BYTES`` or
    longer (module docstring); raises what ``feed`` raises (413, 400). One chunk at a time per
    decoder: await each before the next."""
    if len(chunk) >= OFFLOAD_BYTES:
        return await asyncio.to_thread(decoder.feed, chunk)
    return decoder.feed(chunk)


async def decode_body(content_encoding: str | Iterable[str] | None, body: bytes,
                      limit: int) -> bytes:
    """``body`` received whole, decoded by its ``Content-Encoding`` field values (one or all
    of them, ``body_decoder``): the body itself when it has no coding. Fed 64 KiB at a time,
    each slice off the event loop when it is ``OFFLOAD_BYTES`` or longer. Raises
    ``UnsupportedMediaType`` (415), ``BodyTooLarge`` (413, decoded size past ``limit`` or
    the inflation bound) or ``InvalidRequest`` (400, a corrupt or truncated stream): each
    edge answers them in its client protocol's shape."""
    decoder = body_decoder(content_encoding, limit)
    if decoder is None:
        return body
    view, parts = memoryview(body), []
    for i in range(0, len(body), _PIECE):
        parts.append(await decode_chunk(decoder, bytes(view[i:i + _PIECE])))
    parts.append(decoder.finish())
    return b"".join(parts)
