"""Memory of a decompression bomb: a request body that inflates to 10 GiB of zeros, coded
``gzip`` (or ``deflate``, ``br``, ``zstd``), read by the gateway's ``read_body``.

Run in a fresh process (``python -m loadtests.bench_body_bomb --coding gzip --limit-mib 8``),
it prints one JSON line: ``rss_delta_mib`` (the process's peak RSS, ``ru_maxrss``, a high-water
mark, minus its peak before the request: deterministic, no sampling), ``status`` (413),
``compressed_read_bytes`` (what the gateway read before refusing), ``inflated_total_gib`` (the
bomb's decoded size: 10) and ``limit_mib``. The bomb is produced lazily, 1 MiB of zeros per
compressed chunk (about 1 KiB of gzip), so the client side costs no memory either.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import zlib
from collections.abc import Iterator
from typing import Any

import brotli
import zstandard

from gateway.asgi import read_body
from gateway.errors import GatewayError

MIB = 1024 * 1024
ZEROS = bytes(MIB)


def bomb(coding: str, total_mib: int) -> Iterator[bytes]:
    """The compressed chunks of ``total_mib`` MiB of zeros in ``coding``, lazily."""
    if coding in ("gzip", "deflate"):
        z = zlib.compressobj(9, zlib.DEFLATED, 31 if coding == "gzip" else zlib.MAX_WBITS)
        step, end = (lambda: z.compress(ZEROS) + z.flush(zlib.Z_SYNC_FLUSH)), z.flush
    elif coding == "br":
        b = brotli.Compressor(quality=5)
        step, end = (lambda: b.process(ZEROS) + b.flush()), b.finish
    else:
        c = zstandard.ZstdCompressor(level=3).compressobj()
        step = lambda: c.compress(ZEROS) + c.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)  # noqa: E731
        end = c.flush
    for _ in range(total_mib):
        out = step()
        if out:
            yield out
    yield end()


def peak_rss_mib() -> float:
    """This process's peak resident set so far (MiB; Linux reports ``ru_maxrss`` in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(coding: str, limit: int, total_mib: int = 10 * 1024) -> dict[str, Any]:
    """Feed the bomb to ``read_body`` with ``limit`` (bytes); the figures (module docstring)."""
    chunks = bomb(coding, total_mib)
    first = next(chunks)  # the compressor is warm before the baseline
    read = 0

    async def receive() -> dict[str, Any]:
        nonlocal first, read
        chunk = first if first else next(chunks, b"")
        first = b""
        read += len(chunk)
        return {"type": "http.request", "body": chunk, "more_body": bool(chunk)}

    scope = {"headers": [(b"content-type", b"application/json"),
                         (b"content-encoding", coding.encode())]}
    before = peak_rss_mib()
    status = 200
    try:
        asyncio.run(read_body(scope, receive, limit))
    except GatewayError as e:
        status = e.status
    return {"coding": coding, "status": status, "limit_mib": limit / MIB,
            "inflated_total_gib": total_mib / 1024, "compressed_read_bytes": read,
            "rss_delta_mib": round(peak_rss_mib() - before, 2)}


def main() -> None:
    """``--coding``, ``--limit-mib``, ``--total-mib``: print the JSON figures of one run."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--coding", default="gzip", choices=("gzip", "deflate", "br", "zstd"))
    ap.add_argument("--limit-mib", type=float, default=8.0)
    ap.add_argument("--total-mib", type=int, default=10 * 1024)
    args = ap.parse_args()
    print(json.dumps(measure(args.coding, int(args.limit_mib * MIB), args.total_mib)))


if __name__ == "__main__":
    main()
