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


def read(chunks: list[bytes], coding: str | None, limit: int = 4 * MIB) -> bytes:
    it = iter(chunks)

    async def receive() -> dict[str, Any]:
        chunk = next(it, b"")
        return {"type": "http.request", "body": chunk, "more_body": bool(chunk)}

    headers = [(b"content-type", b"application/json")]
    if coding is not None:
        headers.append((b"content-encoding", coding.encode()))
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


@pytest.mark.parametrize("value", ["compress", "gzip, br", "snappy"])
def test_unknown_or_stacked_coding_is_415(value: str) -> None:
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


def test_gzip_bomb_rss_stays_within_20_mb_of_idle() -> None:
    """The measurement of ``loadtests/bench_body_bomb.py`` in a fresh process: peak RSS
    (``ru_maxrss``, a high-water mark: deterministic) during a 10 GiB gzip bomb against an
    8 MiB bound grows by the bound at most, not by the bomb."""
    out = subprocess.run(
        [sys.executable, "-m", "loadtests.bench_body_bomb", "--coding", "gzip",
         "--limit-mib", "8"], capture_output=True, text=True, timeout=120, check=True)
    got = json.loads(out.stdout)
    assert got["status"] == 413 and got["inflated_total_gib"] == 10
    assert got["compressed_read_bytes"] <= 8 * MIB
    assert got["rss_delta_mib"] < 20, got
