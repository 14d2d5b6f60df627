"""What a request that cannot fit costs the gateway, and what large compressed bodies cost a
concurrent stream.

Two measurements against a local stack (one simulator replica of ``--max-model-len`` tokens
behind a gateway, both on port 0):

- ``overflow``: one chat request whose single prompt is ``--mib`` MiB of text (a repeated
  sentence, English or CJK: ``--text``, sent ``gzip``), and then ``--concurrent`` of them at
  once. Reports the status, the seconds to the answer, the compressed size sent and the
  gateway's peak RSS (``VmHWM`` of its
  process: a high-water mark, so each case runs on a fresh gateway) before and after;
- ``gap``: a streaming request paced by the simulator (a token every ~12 ms) while ``--bodies``
  gzip bodies of ``--body-mib`` MiB each are sent at once: the stream's longest gap between
  two chunks, with and without the burst.

``--source DIR`` runs the gateway of another checkout (e.g. ``git archive`` of a base commit)
to compare before and after in one run. Prints one JSON document.

    python -m loadtests.bench_overflow_cost overflow --mib 8 --concurrent 3
    python -m loadtests.bench_overflow_cost gap --bodies 10 --body-mib 7
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

from loadtests._common import install_loop, new_session, start_gateway, start_sim, stop_processes

MODEL = "fit"
MIB = 1024 * 1024
SENTENCE = "The quick brown fox jumps over the lazy dog, then reads the build log again. "
#: The prompt's text: English, or CJK without spaces (the costliest to count: one segment)
TEXTS = {"english": SENTENCE, "cjk": "漢字かな交じり文の長い文書です"}


def proc_status_mib(pid: int, field: str) -> float:
    """``field`` (``VmHWM``, ``VmRSS``) of process ``pid`` in MiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"no {field}")


def prompt_body(mib: float, kind: str = "english", max_tokens: int = 16) -> bytes:
    """A chat request whose one user message is about ``mib`` MiB (UTF-8) of a repeated
    sentence of ``TEXTS[kind]``, gzip'd."""
    unit = TEXTS[kind]
    n = int(mib * MIB) // len(unit.encode())
    text = unit * n
    doc = {"model": MODEL, "max_tokens": max_tokens,
           "messages": [{"role": "user", "content": text}]}
    return gzip.compress(orjson.dumps(doc), compresslevel=9)


HEADERS = {"Content-Type": "application/json", "Content-Encoding": "gzip"}


async def _learned(url: str) -> None:
    """Wait until the gateway knows the replica's context length (the fit check needs it)."""
    async with new_session() as s:
        for _ in range(200):
            async with s.get(url + "/v1/console/state") as r:
                state = await r.json()
            reps = [r for p in state["models"][0]["pools"] for r in p["replicas"]]
            if reps and all(r["engine"]["max_model_len"] for r in reps):
                return
            await asyncio.sleep(0.1)
    raise RuntimeError("the gateway never learned the replica's max_model_len")


def _stack(args: argparse.Namespace, tmp: Path, name: str, sim_url: str) -> Any:
    cfg = {"server": {"port": 0, "log_level": "warning", "access_log": False,
                      "max_body_bytes": args.max_body_mib * MIB},
           "models": {MODEL: {"tiers": {"standard": {
               "served_model_name": MODEL, "endpoints": [sim_url],
               "routing": {"load_scrape_interval_s": 0.2}}}}}}
    (tmp / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
    return start_gateway(str(tmp / f"{name}.yaml"), str(tmp / f"{name}.log"), source=args.source)


async def _post(s: aiohttp.ClientSession, url: str, body: bytes) -> tuple[int, bytes]:
    async with s.post(url + "/v1/chat/completions", data=body, headers=HEADERS) as r:
        return r.status, await r.read()


async def overflow_case(args: argparse.Namespace, tmp: Path, sim_url: str, n: int) -> dict:
    """``n`` overflowing requests at once on a fresh gateway: statuses, seconds, peak RSS."""
    gw = _stack(args, tmp, f"overflow-{n}", sim_url)
    try:
        url = gw.wait_ready("/readyz")
        await _learned(url)
        body = prompt_body(args.mib, args.text)
        hwm0 = proc_status_mib(gw.pid, "VmHWM")
        t0 = time.monotonic()
        async with new_session() as s:
            got = await asyncio.gather(*(_post(s, url, body) for _ in range(n)))
        secs = round(time.monotonic() - t0, 2)
        return {"requests": n, "decoded_mib": args.mib, "sent_kib": round(len(body) / 1024, 1),
                "statuses": sorted(st for st, _ in got), "seconds": secs,
                "peak_rss_before_mib": hwm0, "peak_rss_after_mib": proc_status_mib(gw.pid, "VmHWM"),
                "message": orjson.loads(got[0][1]).get("error", {}).get("message", "")[:160]}
    finally:
        stop_processes([gw.proc])


async def _stream_gaps(s: aiohttp.ClientSession, url: str, marks: list[float]) -> None:
    body = orjson.dumps({"model": MODEL, "stream": True, "max_tokens": 20_000,
                         "messages": [{"role": "user", "content": "count"}]})
    async with s.post(url + "/v1/chat/completions", data=body,
                      headers={"Content-Type": "application/json"}) as r:
        if r.status != 200:
            raise RuntimeError(f"the paced stream got {r.status}: {await r.read()!r}")
        async for _ in r.content.iter_any():
            marks.append(time.monotonic())


def _longest(marks: list[float], lo: float, hi: float) -> float:
    inside = [t for t in marks if lo <= t <= hi]
    return round(max((b - a for a, b in itertools.pairwise(inside)), default=0.0), 3)


async def gap_case(args: argparse.Namespace, tmp: Path, sim_url: str) -> dict:
    """A paced stream's longest chunk gap alone, then during a burst of compressed bodies."""
    gw = _stack(args, tmp, "gap", sim_url)
    try:
        url = gw.wait_ready("/readyz")
        await _learned(url)
        body = prompt_body(args.body_mib, args.text)
        marks: list[float] = []
        async with new_session() as s:
            stream = asyncio.ensure_future(_stream_gaps(s, url, marks))
            await asyncio.sleep(2.0)
            t_quiet = time.monotonic()
            await asyncio.sleep(args.window_s)
            t_burst = time.monotonic()
            got = await asyncio.gather(*(_post(s, url, body) for _ in range(args.bodies)))
            t_end = time.monotonic()
            await asyncio.sleep(0.5)
            if stream.done():
                stream.result()  # the stream's own failure, if any
            stream.cancel()
            await asyncio.gather(stream, return_exceptions=True)
        return {"bodies": args.bodies, "sent_kib_each": round(len(body) / 1024, 1),
                "decoded_mib_each": args.body_mib, "statuses": sorted(st for st, _ in got),
                "burst_s": round(t_end - t_burst, 2),
                "longest_gap_quiet_s": _longest(marks, t_quiet, t_burst),
                "longest_gap_burst_s": _longest(marks, t_burst, t_end + 0.5)}
    finally:
        stop_processes([gw.proc])


async def run(args: argparse.Namespace) -> dict[str, Any]:
    sim = start_sim(MODEL, 100_000, ("--time-scale", "1", "--max-model-len", str(args.context),
                                     "--kv-cache-tokens", str(max(args.context, 200_000))))
    try:
        sim_url = sim.wait_ready()
        tmp = Path(tempfile.mkdtemp(prefix="speedgate-overflow-"))
        if args.what == "gap":
            return {"gap": await gap_case(args, tmp, sim_url)}
        out = {"one": await overflow_case(args, tmp, sim_url, 1)}
        if args.concurrent > 1:
            out["concurrent"] = await overflow_case(args, tmp, sim_url, args.concurrent)
        return out
    finally:
        stop_processes([sim.proc])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("overflow", "gap"))
    p.add_argument("--mib", type=float, default=8.0, help="decoded prompt size (overflow)")
    p.add_argument("--text", choices=sorted(TEXTS), default="english", help="prompt text")
    p.add_argument("--concurrent", type=int, default=3, help="overflowing requests at once")
    p.add_argument("--context", type=int, default=32768, help="the replica's max_model_len")
    p.add_argument("--bodies", type=int, default=10, help="compressed bodies at once (gap)")
    p.add_argument("--body-mib", type=float, default=7.0, help="decoded size of each (gap)")
    p.add_argument("--window-s", type=float, default=3.0, help="quiet window before the burst")
    p.add_argument("--max-body-mib", type=int, default=64, help="server.max_body_bytes")
    p.add_argument("--source", default=None, help="run the gateway of this checkout")
    args = p.parse_args()
    install_loop()
    print(json.dumps({"args": vars(args), **asyncio.run(run(args))}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
