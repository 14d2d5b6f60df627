"""The cyclic garbage collector under a burst, in-process: what the gateway leaves to it.

``--requests`` chat requests (JSON and streaming alternately, ``--concurrency`` at once) go
through the gateway's ASGI app (started with its lifespan, so its GC settings apply) against
the raw engine (``loadtests.raw_engine``) in the same event loop (uvloop), after 200 warm-up
requests. A ``gc.callbacks`` hook counts collections per generation, their pauses (wall time)
and the objects they freed (members of reference cycles). ``--source DIR`` runs the
``gateway`` package of another checkout (e.g. a base commit) with the same driver: before and
after, side by side, without timing luck (collection counts and freed objects are exact; the
pauses carry the machine's noise). CPU per request includes this driver.

Run::

    .venv/bin/python -m loadtests.bench_gc
    .venv/bin/python -m loadtests.bench_gc --source /tmp/sg-base --json
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

import orjson


class Counts:
    """What the collector did while installed (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.runs = [0, 0, 0]
        self.pause_s = [0.0, 0.0, 0.0]
        self.max_s = 0.0
        self.freed = 0
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        took, gen = time.perf_counter() - self._t0, int(info["generation"])
        self.runs[gen] += 1
        self.pause_s[gen] += took
        self.max_s = max(self.max_s, took)
        self.freed += int(info["collected"])


async def call(app: Any, body: bytes) -> None:
    """One request as uvicorn drives it (``receive`` blocks until the response ended)."""
    done = asyncio.Event()
    msgs = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if msgs:
            return msgs.pop()
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(msg: dict[str, Any]) -> None:
        pass

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/chat/completions",
             "raw_path": b"/v1/chat/completions", "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json")],
             "client": ("127.0.0.1", 1), "server": ("gw", 80), "state": {}}  # fmt: skip
    try:
        await app(scope, receive, send)
    finally:
        done.set()


async def burst(n: int, concurrency: int) -> dict[str, Any]:
    from gateway.app import create_app
    from gateway.config import load_config
    from loadtests.raw_engine import Answers, RawHTTP

    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: RawHTTP(Answers("served", 20)), "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    app = create_app(load_config(health={"enabled": False}, models={"m": {"tiers": {
        "standard": {"served_model_name": "served", "endpoints": [url]}}}}))
    bodies = [orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                            "stream": s}) for s in (False, True)]
    counts = Counts()
    try:
        async with app.api.router.lifespan_context(app.api):
            for i in range(200):
                await call(app, bodies[i % 2])
            sem = asyncio.Semaphore(concurrency)

            async def one(i: int) -> None:
                async with sem:
                    await call(app, bodies[i % 2])

            gc.callbacks.append(counts)
            cpu0 = time.process_time()
            await asyncio.gather(*(one(i) for i in range(n)))
            cpu = time.process_time() - cpu0
            gc.callbacks.remove(counts)
            thresholds, frozen = gc.get_threshold(), gc.get_freeze_count()
    finally:
        server.close()
    return {
        "requests": n, "concurrency": concurrency, "thresholds": thresholds,
        "frozen_objects": frozen, "collections": counts.runs,
        "pause_ms": [round(p * 1e3, 1) for p in counts.pause_s],
        "max_pause_ms": round(counts.max_s * 1e3, 2), "freed_objects": counts.freed,
        "freed_per_request": round(counts.freed / n, 2),
        "cpu_us_per_request_with_driver": round(cpu / n * 1e6),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=20_000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--source", default="", help="run the gateway package of this checkout")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    engine_dir = str(Path(__file__).resolve().parents[1])
    if a.source:  # its gateway first; this checkout's loadtests (the raw engine) still found
        sys.path.insert(0, str(Path(a.source).resolve()))
        sys.modules.pop("loadtests", None)
        sys.path.insert(1, engine_dir)
        import loadtests

        loadtests.__path__.append(str(Path(engine_dir) / "loadtests"))
    import uvloop

    res = uvloop.run(burst(a.requests, a.concurrency))
    import gateway

    res["gateway"] = str(Path(gateway.__file__).resolve().parents[1])
    print(json.dumps(res) if a.json else "\n".join(f"{k}: {v}" for k, v in res.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
