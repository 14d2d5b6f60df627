"""Content codings of engine responses (RFC 9110 §8.4.1).

The gateway asks every engine for ``Accept-Encoding: identity``: it parses every response (JSON
bodies, SSE events), and a compressed event stream would also be buffered by the compressor.
Something between the gateway and the engine (an ingress, a sidecar) may compress anyway; a
response coded ``gzip`` or ``deflate`` is then decoded here (zlib, standard library), chunk by
chunk so streams stay unbuffered. Any other coding cannot be read, and would not be on any
other replica behind the same proxy: ``UndecodableResponse`` is deterministic, never retried and
never counted against the replica's health.
"""

from __future__ import annotations

import zlib

#: What the gateway sends as ``Accept-Encoding`` to engines.
ACCEPT_ENCODING = "identity"


class UndecodableResponse(Exception):
    """The response's ``Content-Encoding`` is one the gateway cannot decode, or its bytes are
    not valid in that coding: the same on every attempt (deterministic)."""


class Decoder:
    """Incremental decoder of one response body in one content coding (``gzip``, ``x-gzip``,
    ``deflate``). ``feed(bytes) -> bytes`` as chunks arrive, ``flush()`` at the end. Raises
    ``UndecodableResponse`` on bytes that are not valid in the coding."""

    __slots__ = ("_coding", "_fresh", "_z")

    def __init__(self, coding: str) -> None:
        self._coding = coding
        self._fresh = True  # nothing decoded yet (a deflate body may still turn out raw)
        # gzip: 16 + MAX_WBITS; deflate (RFC 9110: the zlib format, RFC 1950): MAX_WBITS, with
        # raw deflate (RFC 1951, what some servers send) tried when the zlib header is missing
        wbits = 16 + zlib.MAX_WBITS if coding in ("gzip", "x-gzip") else zlib.MAX_WBITS
        self._z = zlib.decompressobj(wbits)

    def feed(self, chunk: bytes, max_length: int = 0) -> bytes:
        """The decoded bytes of ``chunk`` (possibly empty while the decoder buffers); at most
        ``max_length`` bytes when given (0: all)."""
        try:
            out = self._z.decompress(chunk, max_length)
        except zlib.error:
            if self._coding == "deflate" and self._fresh:
                self._coding = "raw deflate"
                self._z = zlib.decompressobj(-zlib.MAX_WBITS)
                return self.feed(chunk, max_length)
            raise UndecodableResponse(f"engine response is not valid {self._coding}") from None
        if len(chunk) >= 2:
            self._fresh = False
        return out

    def flush(self) -> bytes:
        """Whatever the decoder still holds at the end of the body."""
        try:
            return self._z.flush()
        except zlib.error:
            raise UndecodableResponse(f"engine response is not valid {self._coding}") from None


def decoder_for(content_encoding: str | None) -> Decoder | None:
    """The decoder for a response's ``Content-Encoding`` header: None for no coding or
    ``identity``. Raises ``UndecodableResponse`` for a coding other than gzip and deflate, or
    for several codings stacked (``gzip, br``)."""
    if content_encoding is None:
        return None
    coding = content_encoding.strip().lower()
    if coding in ("", "identity"):
        return None
    if coding in ("gzip", "x-gzip", "deflate"):
        return Decoder(coding)
    raise UndecodableResponse(
        f"engine response has Content-Encoding {content_encoding!r}, which the gateway cannot "
        "decode (it asks for identity): configure the proxy in front of the engine not to "
        "compress"
    )
