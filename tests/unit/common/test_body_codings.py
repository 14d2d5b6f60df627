"""Compressed request bodies: each coding decoded in any chunking, bombs refused at the bound
with flat memory, unknown or stacked codings 415, corrupt or truncated streams 400."""

from __future__ import annotations

import asyncio
import gzip
import json
import subprocess
import sys
import zlib
from typing import Any

import brotli
import pytest
import zstandard

from gateway.asgi import read_body
from gateway.common.body_codings import OFFLOAD_BYTES, coding_list, decode_body, decode_chunk
from gateway.errors import BodyTooLarge, InvalidRequest, UnsupportedMediaType
from loadtests.bench_body_bomb import MIB, bomb

BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi " * 5000}]}).encode()
ENCODE = {
    "gzip": gzip.compress,
    "x-gzip": gzip.compress,
    "deflate": zlib.compress,
    "deflate-raw": lambda b: zlib.compress(b, wbits=-15),
    "br": brotli.compress,
    "zstd": zstandard.ZstdCompressor().compress,
}


def read(chunks: list[bytes], coding: str | list[str] | None, limit: int = 4 * MIB) -> bytes:
    """``read_body`` of ``chunks`` with one ``content-encoding`` field line per value."""
    it = iter(chunks)

    async def receive() -> dict[str, Any]:
        chunk = next(it, b"")
        return {"type": "http.request", "body": chunk, "more_body": bool(chunk)}

    headers = [(b"content-type", b"application/json")]
    for value in [coding] if isinstance(coding, str) else coding or []:
        headers.append((b"content-encoding", value.encode()))
    return asyncio.run(read_body({"headers": headers}, receive, limit))


def pieces(data: bytes, n: int) -> list[bytes]:
    return [data[i:i + n] for i in range(0, len(data), n)]


@pytest.mark.parametrize("coding", sorted(ENCODE))
@pytest.mark.parametrize("chunk", [1, 7, 65536])
def test_each_coding_decodes_in_any_chunking(coding: str, chunk: int) -> None:
    data = ENCODE[coding](BODY)
    name = "deflate" if coding == "deflate-raw" else coding
    assert read(pieces(data, chunk), name.upper() if chunk == 7 else name) == BODY


def test_multi_member_gzip_and_multi_frame_zstd_decode_whole() -> None:
    half = len(BODY) // 2
    two = gzip.compress(BODY[:half]) + gzip.compress(BODY[half:])
    assert read(pieces(two, 100), "gzip") == BODY
    z = zstandard.ZstdCompressor()
    assert read(pieces(z.compress(BODY[:half]) + z.compress(BODY[half:]), 100), "zstd") == BODY


@pytest.mark.parametrize("value", [None, "identity", " Identity "])
def test_no_coding_is_the_body_as_sent(value: str | None) -> None:
    assert read(pieces(BODY, 1000), value) == BODY


@pytest.mark.parametrize("value", ["compress", "gzip, snappy", "snappy",
                                   "gzip, gzip, gzip, gzip"])
def test_unknown_coding_or_more_than_three_is_415(value: str) -> None:
    with pytest.raises(UnsupportedMediaType) as e:
        read([gzip.compress(BODY)], value)
    assert e.value.status == 415 and e.value.param == "content-encoding"


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br", "zstd"])
def test_corrupt_or_truncated_stream_is_400(coding: str) -> None:
    data = ENCODE[coding](BODY)
    with pytest.raises(InvalidRequest) as e:
        read([data[: len(data) // 2]], coding)
    assert e.value.status == 400 and e.value.code == "invalid_encoding"
    with pytest.raises(InvalidRequest):
        read([b"\x00\x01not compressed at all" * 10], coding)


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br", "zstd"])
def test_bomb_is_413_after_reading_less_than_the_bound(coding: str) -> None:
    """10 GiB of zeros, refused once 1 MiB is decoded; the decoders never produced more."""
    chunks = bomb(coding, 10 * 1024)
    taken: list[int] = []

    def counted():
        for c in chunks:
            taken.append(len(c))
            yield c

    with pytest.raises(BodyTooLarge) as e:
        read(list_until(counted(), 64), coding, limit=MIB)
    assert e.value.status == 413
    assert sum(taken) <= MIB


def list_until(gen, n: int) -> list[bytes]:
    """The first ``n`` chunks of ``gen`` (a bomb's first chunks already inflate past 1 MiB)."""
    out = []
    for c in gen:
        out.append(c)
        if len(out) == n:
            break
    return out


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br", "zstd"])
def test_bomb_rss_stays_within_20_mb_of_idle_at_the_default_bound(coding: str) -> None:
    """The measurement of ``loadtests/bench_body_bomb.py`` in a fresh process: peak RSS
    (``ru_maxrss``, a high-water mark: deterministic) during a 10 GiB bomb against the default
    64 MiB bound stays within 20 MiB: the inflation bound refuses it long before the size
    bound would (without it the decoded 64 MiB were held)."""
    out = subprocess.run(
        [sys.executable, "-m", "loadtests.bench_body_bomb", "--coding", coding,
         "--limit-mib", "64"], capture_output=True, text=True, timeout=120, check=True)
    got = json.loads(out.stdout)
    assert got["status"] == 413 and got["inflated_total_gib"] == 10
    assert got["compressed_read_bytes"] <= 64 * 1024
    assert got["rss_delta_mib"] < 20, got


@pytest.mark.slow
@pytest.mark.parametrize("coding", ["gzip", "br", "zstd"])
def test_inflation_past_the_ratio_is_413_and_below_it_is_served(coding: str) -> None:
    """A body inflating past ``MAX_INFLATION``:1 beyond the floor is refused while it
    decodes; a compressible but ordinary JSON body (repetitive agent history) is served."""
    from gateway.common.body_codings import INFLATION_FLOOR, MAX_INFLATION
    bomb = b'{"a": "' + b"0" * (4 * INFLATION_FLOOR) + b'"}'
    packed = ENCODE[coding](bomb)
    assert len(bomb) > MAX_INFLATION * len(packed)  # the case is a real bomb
    with pytest.raises(BodyTooLarge, match="inflates more than"):
        read([packed], coding, limit=64 * MIB)
    # a long agent history: the same files and tool results recur, with varied text between
    words = [b"read", b"gateway/handler.py", b"fix", b"the", b"retry", b"test", b"passed",
             b"def", b"return", b"import", b"self", b"await", b"error", b"line", b"413"]
    x, turns = 7, []
    for i in range(30_000):
        x = (x * 1103515245 + 12345) % 2**31  # a fixed LCG: the same body on any machine
        text = b" ".join(words[(x >> k) % len(words)] for k in range(0, 24, 3))
        turns.append(b'{"role": "user", "content": "%d %s"},' % (i, text))
    ordinary = b'{"messages": [' + b"".join(turns) + b'{"role": "user", "content": "go"}]}'
    packed = ENCODE[coding](ordinary)
    assert len(ordinary) > INFLATION_FLOOR and len(ordinary) < MAX_INFLATION * len(packed)
    assert read([packed], coding, limit=64 * MIB) == ordinary
    # in the chunks a server hands over (Brotli keeps undecoded input inside past its limit)
    assert read(pieces(packed, 65536), coding, limit=64 * MIB) == ordinary


def _stacked(body: bytes, codings: list[str]) -> bytes:
    """``body`` with ``codings`` applied in order (the first listed applied first)."""
    for c in codings:
        body = ENCODE[c](body)
    return body


@pytest.mark.parametrize("fields", [
    ["gzip, br"],  # one field line
    ["gzip", "br"],  # two field lines: one list, in order (RFC 9110 §5.3)
    ["identity", "gzip", " br "],
    ["deflate", "zstd, gzip"],
])
def test_repeated_or_listed_codings_are_decoded_last_to_first(fields: list[str]) -> None:
    codings = [c.strip() for f in fields for c in f.split(",") if c.strip() != "identity"]
    data = _stacked(BODY, codings)
    assert read(pieces(data, 999), fields) == BODY
    assert asyncio.run(decode_body(fields, data, 4 * MIB)) == BODY


def test_the_proxy_reads_every_field_line_not_the_first() -> None:
    """Two lines, gzip then br: the body is br(gzip(json)). Read as its first line only
    (gzip) it was a corrupt-gzip 400; read as the last (br) a 400 on the JSON."""
    assert read([_stacked(BODY, ["gzip", "br"])], ["gzip", "br"]) == BODY
    assert coding_list(["gzip", "br"]) == ["gzip", "br"]
    assert coding_list("GZIP, identity") == ["gzip"]


def test_a_bomb_nested_in_two_codings_is_413() -> None:
    """gzip inside gzip: each stage is bounded, and the chain holds the decoded body to the
    inflation ratio over the bytes received."""
    nested = _stacked(bytes(64 * MIB), ["gzip", "gzip"])
    assert len(nested) < 64 * 1024
    with pytest.raises(BodyTooLarge):
        read(pieces(nested, 4096), ["gzip", "gzip"], limit=64 * MIB)


@pytest.mark.parametrize("codings", [["gzip", "gzip"], ["gzip", "gzip", "gzip"], ["br", "br"],
                                     ["gzip", "br"]])
def test_no_stage_of_stacked_codings_decodes_past_the_chains_allowance(codings) -> None:
    """A short chunk of a nested bomb (a few hundred bytes, decoded on the event loop) makes no
    stage produce more than the chain allows for the bytes received (``INFLATION_FLOOR``, plus
    one output step): the middle stage of ``gzip, gzip`` decoded the whole 8 MiB limit first,
    ~8 ms inline for a 272-byte body, and only then did the chain refuse it."""
    from gateway.common.body_codings import _PIECE, INFLATION_FLOOR, body_decoder

    nested = _stacked(bytes(64 * MIB), codings)
    chunk = nested[:OFFLOAD_BYTES - 1]
    decoder = body_decoder(", ".join(codings), 8 * MIB)
    with pytest.raises(BodyTooLarge):
        decoder.feed(chunk)
        decoder.finish()
    for stage in decoder.decoders:  # type: ignore[attr-defined]
        assert stage.budget.produced <= INFLATION_FLOOR + _PIECE, codings


def test_stacked_codings_of_an_ordinary_body_decode_whole() -> None:
    assert asyncio.run(decode_body(["gzip", "br", "zstd"], _stacked(BODY, ["gzip", "br", "zstd"]),
                                   MIB)) == BODY


def test_decode_body_is_the_body_itself_without_a_coding_and_raises_the_edges_errors() -> None:
    assert asyncio.run(decode_body([], BODY, MIB)) == BODY
    assert asyncio.run(decode_body(["identity"], BODY, MIB)) == BODY
    with pytest.raises(UnsupportedMediaType):
        asyncio.run(decode_body(["lzma"], BODY, MIB))
    with pytest.raises(BodyTooLarge):
        asyncio.run(decode_body(["gzip"], gzip.compress(BODY), 1024))
    with pytest.raises(InvalidRequest):
        asyncio.run(decode_body(["gzip"], gzip.compress(BODY)[:100], MIB))


def test_a_large_chunk_is_decoded_while_the_event_loop_runs(monkeypatch) -> None:
    """The decoder of a large chunk waits (in its thread) for a task on the event loop to
    run: decoded on the loop, that task could not run until the decode ended, and the
    decoder sees the flag unset. A chunk under ``OFFLOAD_BYTES`` is decoded inline."""
    import threading

    import gateway.asgi as asgi_mod
    real = asgi_mod.body_decoder
    ran_during: list[bool] = []
    loop_ran = threading.Event()

    class Waiting:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def feed(self, data: bytes) -> bytes:
            ran_during.append(loop_ran.wait(timeout=5))
            return self.inner.feed(data)

        def finish(self) -> bytes:
            return self.inner.finish()

    monkeypatch.setattr(asgi_mod, "body_decoder", lambda v, limit: Waiting(real(v, limit)))
    varied = json.dumps({"model": "m", "messages": [{"role": "user", "content": " ".join(
        str(i * 7919 % 100_003) for i in range(3000))}]}).encode()
    data = gzip.compress(varied)
    assert len(data) >= OFFLOAD_BYTES

    async def main() -> bytes:
        it = iter([data])

        async def receive() -> dict[str, Any]:
            chunk = next(it, b"")
            return {"type": "http.request", "body": chunk, "more_body": bool(chunk)}

        async def beside() -> None:
            await asyncio.sleep(0)
            loop_ran.set()

        task = asyncio.ensure_future(beside())
        scope = {"headers": [(b"content-type", b"application/json"),
                             (b"content-encoding", b"gzip")]}
        got = await read_body(scope, receive, 4 * MIB)
        await task
        return got

    assert asyncio.run(main()) == varied
    assert ran_during == [True]

    async def small() -> int:
        from unittest import mock
        with mock.patch("asyncio.to_thread", wraps=asyncio.to_thread) as spy:
            decoder = real(["gzip"], MIB)
            assert decoder is not None
            out = await decode_chunk(decoder, gzip.compress(b'{"a": 1}'))
            assert out == b'{"a": 1}'
            return spy.call_count

    assert asyncio.run(small()) == 0
