"""Fuzz the gateway's front doors from outside: ``/v1/responses`` and its state routes,
``/v1/messages``, ``count_tokens`` and chat, on loopback only, bounded by count and time.

Categories (each request draws one, seeded):

- ``body``: a valid body of one API with one field, top-level or nested (content blocks,
  ``tool_result`` content, tools and their schemas, ``tool_choice``, Responses items and
  parts, ``service_tier``, ``metadata``...), replaced by a junk value of another type;
- ``state``: ``GET``/``DELETE``/``cancel`` of junk ids (marker-shaped ``run:<id>``, 100 KB,
  percent-encoded, unicode, foreign and deleted ids) and ``previous_response_id`` of them;
- ``header``: junk ``x-speedgate-tier``, timeouts, session ids, content types;
- ``burst``: first, ten malformed bodies of each kind in a row (consecutive failures are what
  ejects a replica);
- ``leave``: a full request (stream or JSON, either API) whose socket closes at once (FIN or
  RST) or after a random 0-300 ms.

Reported (JSON on stdout): requests, status counts, 5xx (with a sample of bodies), hangs (no
answer in ``HANG_S``), ejections (``speedgate_replica_ejections`` summed from ``/metrics``
after minus before), leaks (a junk id answered 200), disconnects not recorded as 499 (needs
``--log``), and the gateway's RSS before and after (needs its pid).

``--start DIR`` starts its own stack from the code in ``DIR`` (two simulators per tier and a
gateway, ``--redis URL`` for the shared state), so the same fuzzer runs against this tree and
against an older checkout; ``--reasoning-rss`` then also stores 30 responses with 4 MiB
reasoning items and reports the gateway's RSS before, after and once their TTL passed.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

MODEL = "mymodel"
HANG_S = 20.0
JUNK: list[Any] = [5, 1.5, -1, True, None, "x", "", {}, [], [None], [1], {"type": {}},
                   {"a": 1}, "é" * 3]
SCHEMA_JUNK: list[Any] = [{"enum": 5}, {"items": [1]}, {"type": 7}, {"required": "x"},
                          {"properties": 3}, {"anyOf": []}, {"minLength": -1}]
TOOL_SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}}


def _messages_body(rng: random.Random) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 8, "system": [{"type": "text", "text": "be brief"}],
            "messages": [
                {"role": "user", "content": "run the tests"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "running"},
                    {"type": "tool_use", "id": "t1", "name": "run", "input": {"path": "."}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1",
                     "content": [{"type": "text", "text": "1 failed"}]}]}],
            "tools": [{"name": "run", "description": "run",
                       "input_schema": copy.deepcopy(TOOL_SCHEMA)}],
            "tool_choice": {"type": "auto"}, "stop_sequences": ["\n\n"],
            "service_tier": "auto", "metadata": {"user_id": "u"}}


def _responses_body(rng: random.Random) -> dict[str, Any]:
    return {"model": MODEL, "max_output_tokens": 8, "instructions": "be brief",
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "run the tests"}]},
                {"type": "function_call", "call_id": "c1", "name": "run", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "1 failed"}],
            "tools": [{"type": "function", "name": "run",
                       "parameters": copy.deepcopy(TOOL_SCHEMA)}],
            "tool_choice": "auto", "text": {"format": {"type": "text"}},
            "metadata": {"a": "b"}, "store": rng.random() < 0.5}


def _chat_body(rng: random.Random) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 8, "messages": [
                {"role": "user", "content": [{"type": "text", "text": "run the tests"}]},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function",
                     "function": {"name": "run", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "1 failed"}],
            "tools": [{"type": "function", "function": {
                "name": "run", "parameters": copy.deepcopy(TOOL_SCHEMA)}}],
            "tool_choice": "auto"}


APIS = {"/v1/messages": _messages_body, "/v1/messages/count_tokens": _messages_body,
        "/v1/responses": _responses_body, "/v1/chat/completions": _chat_body}


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every field path of ``doc`` (objects' keys and arrays' indices), depth-first."""
    out = []
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) \
        else ()
    for k, v in items:
        out.append((*prefix, k))
        out += _paths(v, (*prefix, k))
    return out


def mutate(doc: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """``doc`` with one field (not ``model``) replaced by junk, or a schema spoiled."""
    paths = [p for p in _paths(doc) if p[0] != "model"]
    path = rng.choice(paths)
    if rng.random() < 0.2:  # spoil a tool schema's nested keyword
        path = next((p for p in paths if p[-1] in ("input_schema", "parameters")), path)
        value: Any = {"type": "object", "properties": {"x": rng.choice(SCHEMA_JUNK)}}
    else:
        value = rng.choice(JUNK)
    node: Any = doc
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return doc


@dataclass
class Report:
    """What one fuzz run saw (see the module docstring)."""

    requests: int = 0
    status: Counter[str] = field(default_factory=Counter)
    by_category: Counter[str] = field(default_factory=Counter)
    server_errors: list[str] = field(default_factory=list)
    hangs: int = 0
    leaks: list[str] = field(default_factory=list)
    leave_ids: list[tuple[str, bool]] = field(default_factory=list)  # (id, closed at once)
    ejections: float = 0.0
    not_aborted: list[str] = field(default_factory=list)
    rss_mib: dict[str, float] = field(default_factory=dict)

    @property
    def five_xx(self) -> int:
        return sum(n for s, n in self.status.items() if s.startswith("5"))

    def summary(self) -> dict[str, Any]:
        return {"requests": self.requests, "by_category": dict(self.by_category),
                "status": dict(sorted(self.status.items())), "5xx": self.five_xx,
                "5xx_samples": self.server_errors[:8], "hangs": self.hangs,
                "leaks": self.leaks[:8], "ejections": self.ejections,
                "disconnects": len(self.leave_ids),
                "disconnects_not_aborted": len(self.not_aborted),
                "disconnects_not_aborted_samples": self.not_aborted[:8],
                "rss_mib": self.rss_mib}


async def _state(c: httpx.AsyncClient, rng: random.Random, rep: Report, known: list[str]) -> None:
    real = rng.choice(known) if known else "resp_" + uuid.uuid4().hex
    rid = rng.choice([f"run:{real}", f"rec:{real}", "x" * rng.choice((200, 70_000, 100_000)),
                      "resp_" + "a" * 129, "resp_%2e%2e", "r%C3%A9sp_1", "resp_" + uuid.uuid4().hex,
                      f"{real}/x", "%00", real + "\\"])
    if rng.random() < 0.25:
        body = {"model": MODEL, "input": "hi", "max_output_tokens": 4,
                "previous_response_id": rid}
        r = await c.post("/v1/responses", json=body)
        _note(rep, "state", r)
        return
    method, suffix = rng.choice([("GET", ""), ("DELETE", ""), ("POST", "/cancel")])
    status, ctype, body_bytes = await _raw(c, method, f"/v1/responses/{rid}{suffix}")
    rep.requests += 1
    rep.by_category["state"] += 1
    rep.status[str(status)] += 1
    if status >= 500:
        rep.server_errors.append(f"{method} {rid[:40]}: {body_bytes[:120]!r}")
    if status == 200 and rid != real:
        rep.leaks.append(f"{method} {rid[:40]}")
    if "json" not in ctype:
        rep.status[f"{status}-not-json"] += 1
        rep.server_errors.append(f"not JSON: {method} {rid[:40]!r}: {body_bytes[:80]!r}")


async def _raw(c: httpx.AsyncClient, method: str, path: str) -> tuple[int, str, bytes]:
    """One request on a raw socket (httpx refuses URLs over 64 KiB)."""
    host, port = str(c.base_url).removeprefix("http://").rstrip("/").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\n"
                     "Connection: close\r\n\r\n".encode())
        raw = await asyncio.wait_for(reader.read(-1), HANG_S)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    ctype = next((ln.split(":", 1)[1] for ln in lines if ln.lower().startswith("content-type")),
                 "")
    return int(lines[0].split()[1]), ctype, body


def _note(rep: Report, category: str, r: httpx.Response) -> None:
    rep.requests += 1
    rep.by_category[category] += 1
    rep.status[str(r.status_code)] += 1
    if r.status_code >= 500:
        rep.server_errors.append(f"{r.request.method} {r.request.url.path}: {r.text[:160]}")


async def _leave(base_url: str, rng: random.Random, rep: Report) -> None:
    path = rng.choice(["/v1/messages", "/v1/responses"])
    rid = f"fuzz-leave-{uuid.uuid4().hex[:12]}"
    stream = rng.random() < 0.5
    text = f"write a long story {rid}"  # plain text: the engine generates all 200 tokens
    doc: dict[str, Any] = (
        {"model": MODEL, "max_tokens": 200, "stream": stream,
         "messages": [{"role": "user", "content": text}]} if path == "/v1/messages" else
        {"model": MODEL, "max_output_tokens": 200, "stream": stream, "input": text})
    body = orjson.dumps(doc)
    host, port = base_url.removeprefix("http://").split(":")
    s = socket.socket()
    s.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(s, (host, int(port)))
    if rng.random() < 0.5:  # RST instead of FIN
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    await loop.sock_sendall(s, (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: "
                                f"application/json\r\nContent-Length: {len(body)}\r\n"
                                f"x-request-id: {rid}\r\n\r\n").encode() + body)
    at_once = rng.random() < 0.5
    if not at_once:  # the engine takes ~2 s for 200 tokens at --time-scale 0.2
        await asyncio.sleep(rng.uniform(0, 0.3))
    s.close()
    rep.requests += 1
    rep.by_category["leave"] += 1
    rep.leave_ids.append((rid, at_once))


BURST = 10  # malformed bodies in a row (ejection takes consecutive failures)


async def _burst(c: httpx.AsyncClient, rep: Report) -> None:
    """``BURST`` malformed bodies in a row per API (``tool_result`` content a number, a tool
    schema with ``enum: 5``, ``tool_choice: {"type": {}}``, Responses ``tools: 1.5``): what
    ejected replicas when each counted as a replica failure."""
    rng = random.Random(0)
    for _ in range(BURST):
        m = _messages_body(rng)
        m["messages"][2]["content"][0]["content"] = 5
        r = await c.post("/v1/messages", json=m)
        _note(rep, "burst", r)
        m = _messages_body(rng)
        m["tools"][0]["input_schema"]["properties"]["path"]["enum"] = 5
        m["tool_choice"] = {"type": {}}
        _note(rep, "burst", await c.post("/v1/messages", json=m))
        resp = _responses_body(rng)
        resp["tools"] = 1.5
        _note(rep, "burst", await c.post("/v1/responses", json=resp))


async def _one(c: httpx.AsyncClient, rng: random.Random, rep: Report, known: list[str]) -> None:
    kind = rng.choices(["body", "state", "header", "leave"], weights=[6, 2, 1, 1])[0]
    if kind == "state":
        await _state(c, rng, rep, known)
        return
    if kind == "leave":
        await _leave(str(c.base_url).rstrip("/"), rng, rep)
        return
    path = rng.choice(list(APIS))
    doc = APIS[path](rng)
    headers = {"content-type": "application/json"}
    if kind == "body":
        doc = mutate(doc, rng)
        if rng.random() < 0.05:
            doc["sim_faults"] = {"status": 500}  # a client scripting the replica
    else:
        name = rng.choice(["x-speedgate-tier", "x-speedgate-timeout", "x-session-id",
                           "x-stainless-timeout", "content-type", "anthropic-version"])
        headers[name] = rng.choice(["fast", "nope", "-1", "1e309", "nan", "x" * 5000, "",
                                    "text/plain", "application/json; charset=latin-1"])
    r = await c.post(path, content=orjson.dumps(doc), headers=headers)
    _note(rep, kind, r)
    if path == "/v1/responses" and r.status_code == 200 and doc.get("store"):
        known.append(r.json()["id"])


def _ejections(base_url: str) -> float:
    text = httpx.get(base_url + "/metrics", timeout=10).text
    return sum(float(m.group(1)) for m in re.finditer(
        r"^speedgate_replica_ejections_total\{[^}]*\} (\S+)$", text, re.M))


def rss_mib(pid: int | None) -> float | None:
    """Resident set size of ``pid`` in MiB (Linux ``/proc``), None when unknown."""
    if pid is None:
        return None
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return None


async def fuzz(base_url: str, *, count: int, time_s: float, seed: int, concurrency: int = 4,
               pid: int | None = None, log: Path | None = None) -> Report:
    """Run up to ``count`` requests (or ``time_s`` seconds) against ``base_url``; a ``Report``.
    ``log``: the gateway's log file, to check every disconnect was recorded as 499 (one
    closed after a delay may have been answered 200 in full by then)."""
    rng = random.Random(seed)
    rep, known = Report(), []
    before = _ejections(base_url)
    rep.rss_mib["before"] = rss_mib(pid) or 0.0
    deadline = time.monotonic() + time_s
    async with httpx.AsyncClient(base_url=base_url, timeout=HANG_S) as c:
        await _burst(c, rep)

        async def worker(wid: int) -> None:
            wrng = random.Random(rng.random())
            while rep.requests < count and time.monotonic() < deadline:
                try:
                    await _one(c, wrng, rep, known)
                except (httpx.TimeoutException, TimeoutError):
                    rep.hangs += 1
                    rep.requests += 1
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
    await asyncio.sleep(1.0)  # the last disconnects are logged
    if log is not None:
        text = await asyncio.to_thread(log.read_text)
        for rid, at_once in rep.leave_ids:
            m = re.search(rf"request_id={re.escape(rid)} .* status=(\d+)", text)
            got = m.group(1) if m else "not logged"
            # closed at once: must be 499; closed later: 499, or 200 if it was done by then
            if got != "499" and (at_once or got != "200"):
                rep.not_aborted.append(f"{rid}: {got}")
    rep.ejections = _ejections(base_url) - before
    rep.rss_mib["after"] = rss_mib(pid) or 0.0
    return rep


# ----- a stack of its own, from any checkout -----


def _spawn(cmd: list[str], cwd: Path, out: Path) -> tuple[subprocess.Popen[bytes], int]:
    port_file = Path(tempfile.mkdtemp(prefix="fuzz-port-")) / "port"
    env = {**os.environ, "PYTHONPATH": str(cwd), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([*cmd, "--port-file", str(port_file)], cwd=cwd, env=env,
                            stdout=out.open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if port_file.exists() and port_file.read_text().strip():
            return proc, int(port_file.read_text())
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd[2]} exited: {out.read_text()[-2000:]}")
        time.sleep(0.1)
    raise RuntimeError(f"{cmd} reported no port")


def start_stack(code: Path, tmp: Path, redis_url: str | None
                ) -> tuple[list[subprocess.Popen[bytes]], str, int, Path]:
    """Two simulators per tier and a gateway, all from the code in ``code``: the processes,
    the gateway's URL, its pid and its log."""
    procs, urls = [], {"standard": [], "fast": []}
    tiers = [("standard", "standard")] * 2 + [("fast", "speculative")] * 2
    for i, (tier, mode) in enumerate(tiers):
        p, port = _spawn([sys.executable, "-m", "engines.sim", "--port", "0",
                          "--served-model-name", MODEL, "--mode", mode, "--seed", str(i),
                          "--time-scale", "0.2", "--output-tokens", "200"], code,
                         tmp / f"sim{i}.log")
        procs.append(p)
        urls[tier].append(f"http://127.0.0.1:{port}")
    prefix = f"fuzz:{uuid.uuid4().hex[:8]}:"
    state = {"redis_url": redis_url, "routing_key_prefix": prefix + "route:"} if redis_url else {}
    cfg = {"server": {"port": 0, "max_body_bytes": 8 * 1024 * 1024},
           "health": {"interval_s": 0.5, "timeout_s": 1},
           **({"state": state} if state else {}),
           "responses": {"store_ttl_s": 5, "memory_max_bytes": 64 * 1024 * 1024,
                         **({"redis_prefix": prefix + "resp:"} if redis_url else {})},
           "models": {MODEL: {"fallback": {"fast": "standard"}, "tiers": {
               tier: {"served_model_name": MODEL, "endpoints": u,
                      "timeouts": {"connect_s": 2, "ttft_s": 10, "stall_s": 10, "total_s": 60}}
               for tier, u in urls.items()}}}}
    if not (code / "gateway/config/process.py").read_text().count("memory_max_bytes"):
        del cfg["responses"]["memory_max_bytes"]  # an older checkout has no such field
    (tmp / "gateway.yaml").write_text(yaml.safe_dump(cfg))
    log = tmp / "gateway.log"
    g, port = _spawn([sys.executable, "-m", "gateway", "serve", "-c", str(tmp / "gateway.yaml")],
                     code, log)
    procs.append(g)
    base = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            if httpx.get(base + "/readyz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return procs, base, g.pid, log


async def reasoning_rss(base_url: str, pid: int, ttl_s: float) -> dict[str, float]:
    """Store 30 responses whose input holds a 4 MiB reasoning item; RSS (MiB) before, after
    and once their TTL (``ttl_s``) passed with no request meanwhile."""
    out = {"before": rss_mib(pid) or 0.0}
    big = "r" * (4 * 1024 * 1024)
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as c:
        for _ in range(30):
            body = {"model": MODEL, "max_output_tokens": 4, "store": True, "input": [
                {"type": "reasoning", "id": "rs_1", "summary": [
                    {"type": "summary_text", "text": big}]},
                {"role": "user", "content": "hi"}]}
            r = await c.post("/v1/responses", json=body)
            r.raise_for_status()
    out["after_30"] = rss_mib(pid) or 0.0
    await asyncio.sleep(ttl_s + 2)
    out["after_ttl"] = rss_mib(pid) or 0.0
    return out


def _per_call_us(fn: Any, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


async def _loop_lag_ms(work: Any) -> float:
    """The longest gap (ms) between 1 ms ticks of the event loop while ``work()`` runs."""
    worst, stop = 0.0, False

    async def ticker() -> None:
        nonlocal worst
        last = time.perf_counter()
        while not stop:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            worst, last = max(worst, now - last), now

    t = asyncio.get_running_loop().create_task(ticker())
    await asyncio.sleep(0.01)
    await work()
    stop = True
    await t
    return worst * 1e3


def bench() -> dict[str, Any]:
    """Costs of the front-door checks on this machine (µs per call, ms of loop stall)."""
    from gateway.admit.body_schema import check_body_schema
    from gateway.admit.parse import OFFLOAD_PARSE_BYTES, parse_checked, read_checked
    from gateway.admit.tool_schema import schema_problem
    from gateway.protocols.messages.protocol import MessagesProtocol

    rng = random.Random(0)
    small = _messages_body(rng)
    schema = {"type": "object", "required": ["a1"], "properties": {
        f"a{i}": {"type": "string", "description": "d" * 50} for i in range(10)}}
    big = {**small, "messages": [{"role": "user" if i % 2 == 0 else "assistant",
                                  "content": [{"type": "text", "text": "x" * 2000}]}
                                 for i in range(501)],
           "tools": [{"name": f"t{i}", "input_schema": schema} for i in range(20)]}
    raw_big = orjson.dumps(big)
    proto = MessagesProtocol()
    out: dict[str, Any] = {
        "schema_walk_10_props_us": _per_call_us(lambda: schema_problem(schema), 2000),
        "body_schema_small_us": _per_call_us(lambda: check_body_schema("messages", small), 2000),
        "body_schema_1mb_20_tools_us": _per_call_us(lambda: check_body_schema("messages", big),
                                                    20),
        "big_body_bytes": len(raw_big),
        "parse_checked_1mb_us": _per_call_us(lambda: parse_checked(proto, raw_big, 64), 20),
        "offload_threshold_bytes": OFFLOAD_PARSE_BYTES,
    }
    raw_64k = orjson.dumps({**small, "messages": [{"role": "user", "content": "x" * 65000}]})
    out["parse_checked_64kib_us"] = _per_call_us(lambda: parse_checked(proto, raw_64k, 64), 500)
    try:
        from jsonschema import Draft202012Validator
        out["jsonschema_meta_check_10_props_us"] = _per_call_us(
            lambda: Draft202012Validator.check_schema(schema), 50)
    except ImportError:
        pass

    async def lags() -> None:
        hop = time.perf_counter()
        for _ in range(200):
            await asyncio.to_thread(int)
        out["thread_hop_us"] = (time.perf_counter() - hop) / 200 * 1e6
        raw_8m = orjson.dumps({**big, "messages": big["messages"] * 8})
        out["body_8mb_bytes"] = len(raw_8m)

        async def inline() -> None:
            parse_checked(proto, raw_8m, 64)

        async def offloaded() -> None:
            await read_checked(proto, raw_8m, 64)

        out["loop_stall_8mb_inline_ms"] = await _loop_lag_ms(inline)
        out["loop_stall_8mb_offloaded_ms"] = await _loop_lag_ms(offloaded)

    asyncio.run(lags())
    return {k: round(v, 1) if isinstance(v, float) else v for k, v in out.items()}


def main() -> None:
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--url", help="a running gateway (else --start)")
    a.add_argument("--start", type=Path, help="start a stack from the code in this checkout")
    a.add_argument("--redis", default=None, help="Redis URL for the started stack")
    a.add_argument("--count", type=int, default=1000)
    a.add_argument("--time-s", type=float, default=120.0)
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--concurrency", type=int, default=4)
    a.add_argument("--reasoning-rss", action="store_true")
    a.add_argument("--bench", action="store_true",
                   help="only time the front-door checks in this process (no stack)")
    ns = a.parse_args()
    if ns.bench:
        print(json.dumps(bench(), indent=1))
        return
    procs: list[subprocess.Popen[bytes]] = []
    pid, log = None, None
    try:
        if ns.start:
            tmp = Path(tempfile.mkdtemp(prefix="fuzz-stack-"))
            procs, url, pid, log = start_stack(ns.start.resolve(), tmp, ns.redis)
        else:
            url = ns.url
        rep = asyncio.run(fuzz(url, count=ns.count, time_s=ns.time_s, seed=ns.seed,
                               concurrency=ns.concurrency, pid=pid, log=log))
        out = rep.summary()
        if ns.reasoning_rss and pid is not None:
            out["reasoning_rss_mib"] = asyncio.run(reasoning_rss(url, pid, 5))
        print(json.dumps(out, indent=1))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    main()
