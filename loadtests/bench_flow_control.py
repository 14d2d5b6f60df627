"""Flow control benchmark: interactive TTFT under a batch-agent flood, with and
without priority bands and fair queuing, side by side in one run.

Engines: ``--replicas`` simulated standard replicas (``engines.sim``), each running at most
``--max-num-seqs`` sequences (the rest wait in the engine's FCFS queue, as vLLM's), delays ×
``--time-scale``. Capacity = replicas × max-num-seqs sequences.

Workload (API keys with auth on, closed loops, all streaming with usage):

- 2 interactive keys (``default_band: interactive``), ``--interactive-users`` users each:
  short chat turns (``--interactive-tokens`` output tokens), think time 0.3-0.7 s;
- 4 batch agent keys (``default_band: batch``, equal weights), ``--batch-sessions`` sessions
  each, one of them (``flood``) ``--flood-factor`` times as many: agent sessions of
  ``--turns`` turns with a growing context (each turn adds the reply and a tool result), back
  to back, ``--batch-tokens`` output tokens a turn, a deadline of ``--batch-deadline-s``
  (``x-speedgate-timeout``); a refused turn (429/503) waits its ``Retry-After`` and retries.

Three phases through two gateways on the same replicas (caches reset in between): ``idle``
(interactive users alone, the reference TTFT), ``off`` (flow control off: no slot cap, every
request goes straight to the engines, today's behaviour) and ``on`` (``max_inflight_per_replica``
= the engines' ``max-num-seqs``, bands with ``--reserved-share`` of the slots kept for the
interactive band). Each loaded phase: ``--warmup-s`` unmeasured, then ``--duration-s``
measured (requests started in the window; tokens of requests finished in it), then new
requests stop and the ones in flight get ``--drain-s`` to finish (the rest count as hung).

Reported per phase: interactive TTFT p50/p95/max (s) at the client and as the gateway timed it
upstream (``x-speedgate-ttft-s``: request sent to the engine → first token), batch TTFT
p95/max; the pool's output
tokens/s as the engines count them (``vllm:generation_tokens_total``, tokens of requests later
cut off included) and as clients received them in complete answers (goodput); served output
tokens per batch key and Jain's fairness index over the four equal-weight batch keys
((Σx)² / (n Σx²); 1 = equal; Jain, Chiu, Hawe 1984), the flooding key's share, and per key its
requests, refusals and mean queue wait; refusals at arrival (count, answer time p50/p95/max in
ms, how many had ``Retry-After``), requests that timed out in the queue or were cut off by their
deadline mid-answer; the engines' mean running and waiting sequences; hung requests; the
longest gateway-queue wait of a batch request (``x-speedgate-queue-wait-s``). ``--plot PATH``:
TTFT by band over time, off vs on. ``--json``: one JSON object (without the raw samples).

    python -m loadtests.bench_flow_control --plot docs/img/bench_flow_control.png
    python -m loadtests.bench_flow_control --small --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

from engines.procs import stop_processes
from engines.sim.spawn import spawn_simulator
from gateway.admit.auth import new_key
from loadtests._common import install_loop, pct, start_gateway

MODEL = "mymodel"
WORDS = ("build", "test", "error", "file", "line", "passed", "failed", "module", "import", "def",
         "return", "value", "config", "assert", "trace", "call", "stack", "warning", "result")
BATCH_KEYS = ("agents-a", "agents-b", "agents-c", "flood")
INTERACTIVE_KEYS = ("chat-a", "chat-b")


@dataclass
class Params:
    replicas: int = 2
    max_num_seqs: int = 16
    time_scale: float = 3.0
    interactive_users: int = 1
    interactive_tokens: int = 32
    batch_sessions: int = 8
    flood_factor: int = 10
    turns: int = 6
    batch_tokens: int = 192
    batch_deadline_s: float = 30.0
    reserved_share: float = 0.0625
    max_wait_s: float = 60.0
    idle_s: float = 20.0
    warmup_s: float = 15.0
    duration_s: float = 90.0
    drain_s: float = 60.0
    seed: int = 0
    inflight_sweep: str = ""  # more "on" phases at these max_inflight_per_replica ("8,12")
    compare_guard: int = 0  # 1: one more "on" phase with the first-token guard off


@dataclass
class Sample:
    """One finished request, times in seconds from the phase start."""

    key: str
    band: str
    start: float
    end: float
    status: int
    ttft: float | None = None
    upstream_ttft: float | None = None  # x-speedgate-ttft-s: the gateway's send → first token
    tokens: int = 0
    prompt_tokens: int = 0
    queue_wait: float | None = None
    admit_s: float | None = None  # x-speedgate-admit-s of a refusal: arrival → decision, gateway
    retry_after: str | None = None
    code: str | None = None  # the error code of a refusal


@dataclass
class Phase:
    samples: list[Sample] = field(default_factory=list)
    errors: Counter = field(default_factory=Counter)
    hung: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    # (t, running, waiting, generated tokens so far) summed over the replicas
    engine: list[tuple[float, int, int, float]] = field(default_factory=list)
    # (t, gateway slots in use, gateway queue length) of a gated pool
    gateway: list[tuple[float, float, float]] = field(default_factory=list)
    # (t, s): how late the load generator's own event loop woke from a 10 ms sleep
    loop_lag: list[tuple[float, float]] = field(default_factory=list)


class Keys:
    """API keys of the run: raw key per id, and the config entries."""

    def __init__(self) -> None:
        self.raw: dict[str, str] = {}
        self.entries: list[dict[str, Any]] = []
        for kid in INTERACTIVE_KEYS + BATCH_KEYS:
            key, digest = new_key()
            self.raw[kid] = key
            band = "interactive" if kid in INTERACTIVE_KEYS else "batch"
            self.entries.append({"id": kid, "hash": digest, "default_band": band})


async def stream_turn(http: aiohttp.ClientSession, url: str, key: str, doc: dict[str, Any],
                      headers: dict[str, str], t0: float) -> tuple[Sample, str]:
    """One streaming request; the sample and the reply text."""
    start = time.perf_counter() - t0
    band = "interactive" if key in INTERACTIVE_KEYS else "batch"
    s = Sample(key, band, start, start, 0)
    text: list[str] = []
    async with http.post(url + "/v1/chat/completions", data=orjson.dumps(doc),
                         headers={"content-type": "application/json", **headers}) as r:
        s.status = r.status
        s.retry_after = r.headers.get("retry-after")
        qw = r.headers.get("x-speedgate-queue-wait-s")
        s.queue_wait = float(qw) if qw else None
        adm = r.headers.get("x-speedgate-admit-s")
        s.admit_s = float(adm) if adm else None
        ut = r.headers.get("x-speedgate-ttft-s")
        s.upstream_ttft = float(ut) if ut else None
        if r.status != 200:
            try:
                s.code = orjson.loads(await r.read())["error"]["code"]
            except (ValueError, KeyError, TypeError):
                s.code = "unparsed"
            s.end = time.perf_counter() - t0
            return s, ""
        async for line in r.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            ev = orjson.loads(line[6:])
            if ev.get("usage"):
                s.tokens = ev["usage"].get("completion_tokens") or 0
                s.prompt_tokens = ev["usage"].get("prompt_tokens") or 0
            for ch in ev.get("choices") or ():
                piece = (ch.get("delta") or {}).get("content")
                if piece:
                    if s.ttft is None:
                        s.ttft = time.perf_counter() - t0 - start
                    text.append(piece)
    s.end = time.perf_counter() - t0
    return s, "".join(text)


class Run:
    """The users of one phase against one gateway."""

    def __init__(self, p: Params, keys: Keys, url: str, with_batch: bool,
                 sims: list[str]) -> None:
        self.p, self.keys, self.url, self.with_batch = p, keys, url, with_batch
        self.sims = sims
        self.phase = Phase()
        self.stop_at = 0.0
        self.t0 = 0.0
        self.inflight = 0

    async def _one(self, http: aiohttp.ClientSession, key: str, doc: dict[str, Any],
                   headers: dict[str, str]) -> tuple[Sample | None, str]:
        self.inflight += 1
        try:
            s, text = await stream_turn(http, self.url, key, doc, {
                "authorization": f"Bearer {self.keys.raw[key]}", **headers}, self.t0)
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            self.phase.errors[type(e).__name__] += 1
            return None, ""
        finally:
            self.inflight -= 1
        self.phase.samples.append(s)
        if s.status != 200 and s.status not in (429, 503):
            self.phase.errors[f"http {s.status}"] += 1
        return s, text

    async def interactive(self, http: aiohttp.ClientSession, key: str, i: int) -> None:
        rng = random.Random(f"{self.p.seed}-{key}-{i}")
        await asyncio.sleep(rng.uniform(0, 0.5))
        n = 0
        while time.perf_counter() < self.stop_at:
            n += 1
            question = " ".join(rng.choice(WORDS) for _ in range(60))
            doc = {"model": MODEL, "stream": True, "max_tokens": self.p.interactive_tokens,
                   "stream_options": {"include_usage": True}, "messages": [
                       {"role": "system", "content": "You are a concise assistant."},
                       {"role": "user", "content": f"{key}-{i}-{n}: {question}"}]}
            await self._one(http, key, doc, {})
            await asyncio.sleep(rng.uniform(0.3, 0.7))

    async def agent(self, http: aiohttp.ClientSession, key: str, i: int) -> None:
        rng = random.Random(f"{self.p.seed}-{key}-{i}-agent")
        await asyncio.sleep(rng.uniform(0, min(5.0, self.p.warmup_s)))
        system = "You are a coding agent. Tools: run, read, edit. " + " ".join(
            random.Random(self.p.seed).choice(WORDS) for _ in range(200))
        n_session = 0
        while time.perf_counter() < self.stop_at:
            n_session += 1
            sid = f"{key}-{i}-{n_session}"
            msgs: list[dict[str, Any]] = [
                {"role": "system", "content": system},
                {"role": "user", "content": f"Task {sid}: fix issue #{rng.randrange(10**6)}"}]
            for turn in range(self.p.turns):
                if time.perf_counter() >= self.stop_at:
                    return
                doc = {"model": MODEL, "stream": True, "max_tokens": self.p.batch_tokens,
                       "stream_options": {"include_usage": True}, "messages": msgs}
                headers = {"x-session-id": sid,
                           "x-speedgate-timeout": str(self.p.batch_deadline_s)}
                s, reply = await self._one(http, key, doc, headers)
                while s is not None and s.status in (429, 503):  # refused: as told, then retry
                    await asyncio.sleep(min(float(s.retry_after or 1), 30.0))
                    if time.perf_counter() >= self.stop_at:
                        return
                    s, reply = await self._one(http, key, doc, headers)
                tool = " ".join(rng.choice(WORDS) for _ in range(150))
                msgs = [*msgs, {"role": "assistant", "content": reply},
                        {"role": "user", "content": f"[tool result {turn}] {tool}"}]

    async def drive(self, seconds: float) -> Phase:
        self.t0 = time.perf_counter()
        self.stop_at = self.t0 + seconds
        conn = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=self.p.drain_s + seconds + 60)
        async with aiohttp.ClientSession(connector=conn, timeout=timeout) as http:
            tasks = [asyncio.ensure_future(self.interactive(http, k, i))
                     for k in INTERACTIVE_KEYS for i in range(self.p.interactive_users)]
            if self.with_batch:
                for k in BATCH_KEYS:
                    n = self.p.batch_sessions * (self.p.flood_factor if k == "flood" else 1)
                    tasks += [asyncio.ensure_future(self.agent(http, k, i)) for i in range(n)]
            lag = asyncio.ensure_future(self.watch_loop())
            await self.sample_engines(http, seconds)
            lag.cancel()
            _, pending = await asyncio.wait(tasks, timeout=self.p.drain_s)
            self.phase.hung = self.inflight
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            self.phase.metrics = await gateway_metrics(http, self.url)
        return self.phase


    async def watch_loop(self) -> None:
        """The load generator's own event-loop lag (s late from a 10 ms sleep): the share of
        a client-side answer time that is the client's, not the gateway's."""
        while True:
            t = time.perf_counter()
            await asyncio.sleep(0.01)
            self.phase.loop_lag.append((t - self.t0, time.perf_counter() - t - 0.01))

    async def sample_engines(self, http: aiohttp.ClientSession, seconds: float) -> None:
        """Every 0.5 s until the phase ends: the engines' running and waiting sequences and
        their ``vllm:generation_tokens_total`` (the pool's output tokens, whoever asked)."""
        while (now := time.perf_counter()) < self.stop_at + 0.5:
            running = waiting = 0
            generated = 0.0
            for u in self.sims:
                async with http.get(u + "/sim/stats") as r:
                    st = await r.json()
                running, waiting = running + st["running"], waiting + st["waiting"]
                async with http.get(u + "/metrics") as r:
                    for line in (await r.text()).splitlines():
                        if line.startswith("vllm:generation_tokens_total"):
                            generated += float(line.rsplit(" ", 1)[1])
            self.phase.engine.append((now - self.t0, running, waiting, generated))
            slots = queued = 0.0
            async with http.get(self.url + "/metrics") as r:
                for line in (await r.text()).splitlines():
                    if line.startswith("speedgate_queue_slots_in_use{"):
                        slots += float(line.rsplit(" ", 1)[1])
                    elif line.startswith("speedgate_queue_length{"):
                        queued += float(line.rsplit(" ", 1)[1])
            self.phase.gateway.append((now - self.t0, slots, queued))
            await asyncio.sleep(0.5)


async def gateway_metrics(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """Flow-control counters of the gateway (``speedgate_queue_*``), summed over labels but
    the reason/band."""
    from prometheus_client.parser import text_string_to_metric_families

    async with http.get(url + "/metrics") as r:
        text = await r.text()
    out: Counter = Counter()
    for fam in text_string_to_metric_families(text):
        if fam.name in ("speedgate_queue_shed", "speedgate_queue_promotions"):
            for smp in fam.samples:
                if smp.name.endswith("_total"):
                    label = smp.labels.get("reason") or smp.labels.get("from_band", "")
                    out[f"{fam.name}[{label}]"] += smp.value
    return dict(out)


def jain(xs: list[float]) -> float | None:
    """Jain's fairness index (Jain, Chiu, Hawe 1984): (Σx)² / (n Σx²), 1 when all equal."""
    sq = sum(x * x for x in xs)
    return (sum(xs) ** 2) / (len(xs) * sq) if sq else None


def summarize(ph: Phase, warmup_s: float, duration_s: float) -> dict[str, Any]:
    lo, hi = warmup_s, warmup_s + duration_s
    inside = [s for s in ph.samples if lo <= s.start < hi]
    ok = [s for s in inside if s.status == 200 and s.ttft is not None]
    inter = [s.ttft for s in ok if s.band == "interactive" and s.ttft is not None]
    inter_up = [s.upstream_ttft for s in ok
                if s.band == "interactive" and s.upstream_ttft is not None]
    batch = [s.ttft for s in ok if s.band == "batch" and s.ttft is not None]
    finished = [s for s in ph.samples if s.status == 200 and lo <= s.end < hi]
    served = {k: sum(s.tokens for s in finished if s.key == k) for k in BATCH_KEYS}
    served_all = {k: sum(s.tokens + s.prompt_tokens for s in finished if s.key == k)
                  for k in BATCH_KEYS}
    shed = [s for s in inside if s.code in ("queue_wait_too_long", "queue_full")
            or (s.code == "resource_unavailable" and s.end - s.start < 1.0)]
    timed_out = [s for s in inside if s.code == "queue_timeout"
                 or (s.code == "resource_unavailable" and s.end - s.start >= 1.0)]
    cut = [s for s in inside if s.status == 200 and s.ttft is not None and not s.tokens]
    eng = [(r, w) for t, r, w, _ in ph.engine if lo <= t < hi]
    gen = [(t, g) for t, _, _, g in ph.engine if lo <= t <= hi + 0.5]
    pool_tps = (gen[-1][1] - gen[0][1]) / (gen[-1][0] - gen[0][0]) if len(gen) > 1 else None
    waits = [s.queue_wait for s in inside if s.band == "batch" and s.queue_wait is not None]

    shed_ms = [(s.end - s.start) * 1e3 for s in shed]
    shed_gw_ms = [s.admit_s * 1e3 for s in shed if s.admit_s is not None]
    lag_ms = [x * 1e3 for t, x in ph.loop_lag if lo <= t < hi]
    gw = [(a, b) for t, a, b in ph.gateway if lo <= t < hi]

    def per_key(key: str) -> dict[str, Any]:
        mine = [s for s in inside if s.key == key]
        w = [s.queue_wait or 0.0 for s in mine if s.status == 200]
        return {"requests": len(mine), "served_tokens": served[key],
                "served_prompt_and_output_tokens": served_all[key],
                "shed": sum(1 for s in mine if s in shed),
                "queue_wait_mean_s": round(sum(w) / len(w), 3) if w else None}

    def r(x: float | None, n: int = 3) -> float | None:
        return None if x is None or x != x else round(x, n)

    total = sum(s.tokens for s in finished)
    return {
        "requests": len(inside),
        "interactive_ttft_p50_s": r(pct(inter, 0.5), 4),
        "interactive_ttft_p95_s": r(pct(inter, 0.95), 4),
        "interactive_ttft_max_s": r(max(inter), 4) if inter else None,
        "interactive_engine_ttft_p50_s": r(pct(inter_up, 0.5), 4),
        "interactive_engine_ttft_p95_s": r(pct(inter_up, 0.95), 4),
        "interactive_requests": len(inter),
        "batch_ttft_p95_s": r(pct(batch, 0.95)),
        "batch_ttft_max_s": r(max(batch)) if batch else None,
        "output_tokens_per_s": r(pool_tps, 1),
        "client_output_tokens_per_s": r(total / duration_s, 1),
        "served_tokens": served,
        "jain_batch": r(jain(list(served.values()))),
        "jain_batch_prompt_and_output": r(jain(list(served_all.values()))),
        "flood_share": r(served["flood"] / sum(served.values())) if sum(served.values())
        else None,
        # what the fair queue shares: estimated prompt + output tokens
        "flood_share_prompt_and_output": r(served_all["flood"] / sum(served_all.values()))
        if sum(served_all.values()) else None,
        "shed": len(shed),
        "shed_p50_ms": r(pct(shed_ms, 0.5), 1) if shed else None,
        "shed_p95_ms": r(pct(shed_ms, 0.95), 1) if shed else None,
        "shed_slowest_ms": r(max(shed_ms), 1) if shed else None,
        "shed_with_retry_after": sum(1 for s in shed if s.retry_after),
        "shed_over_50ms": sum(1 for x in shed_ms if x > 50),
        "shed_gateway_over_50ms": sum(1 for x in shed_gw_ms if x > 50),
        "shed_gateway_p50_ms": r(pct(shed_gw_ms, 0.5), 2) if shed_gw_ms else None,
        "shed_gateway_p95_ms": r(pct(shed_gw_ms, 0.95), 2) if shed_gw_ms else None,
        "shed_gateway_max_ms": r(max(shed_gw_ms), 2) if shed_gw_ms else None,
        "client_loop_lag_p50_ms": r(pct(lag_ms, 0.5), 1) if lag_ms else None,
        "client_loop_lag_p95_ms": r(pct(lag_ms, 0.95), 1) if lag_ms else None,
        "client_loop_lag_max_ms": r(max(lag_ms), 1) if lag_ms else None,
        "gateway_slots_mean": r(sum(a for a, _ in gw) / len(gw), 1) if gw else None,
        "gateway_queue_mean": r(sum(b for _, b in gw) / len(gw), 1) if gw else None,
        "timed_out_in_queue": len(timed_out),
        "cut_by_deadline": len(cut),
        "engine_running_mean": r(sum(x for x, _ in eng) / len(eng), 1) if eng else None,
        "engine_waiting_mean": r(sum(y for _, y in eng) / len(eng), 1) if eng else None,
        "hung": ph.hung,
        "batch_queue_wait_max_s": r(max(waits)) if waits else None,
        "keys": {k: per_key(k) for k in BATCH_KEYS},
        "errors": dict(ph.errors),
        "gateway": ph.metrics,
    }


def gateway_config(urls: list[str], keys: Keys, p: Params, mode: tuple[int | None, bool]
                   ) -> dict[str, Any]:
    """The gateway of one mode ``(inflight, guard)``: ``inflight`` None = flow control off;
    else flow control on with that ``max_inflight_per_replica``, the band as the engines'
    priority, and the first-token guard on or off."""
    inflight, guard = mode
    flow = inflight is not None
    pool: dict[str, Any] = {"served_model_name": MODEL, "endpoints": urls,
                            "timeouts": {"ttft_s": 600, "stall_s": 60, "total_s": 900},
                            "routing": {"load_scrape_interval_s": 0.5}}
    if flow:
        pool["max_inflight_per_replica"] = inflight
        pool["scheduling_policy"] = "priority"
    return {
        "server": {"port": 0, "access_log": False, "log_level": "warning"},
        "health": {"interval_s": 1.0},
        "auth": {"keys": keys.entries},
        "flow_control": {"enabled": flow, "first_token_guard_s": 0.5 if guard else 0, "bands": [
            {"name": "interactive", "max_queue_s": 10, "reserved_share": p.reserved_share},
            {"name": "standard", "max_queue_s": 60},
            {"name": "batch", "max_queue_s": 900, "max_wait_s": p.max_wait_s},
        ]},
        "models": {MODEL: {"tiers": {"standard": pool}}},
    }


async def reset(urls: list[str]) -> None:
    async with aiohttp.ClientSession() as http:
        for u in urls:
            async with http.post(u + "/sim/reset") as r:
                r.raise_for_status()


async def phases(p: Params, keys: Keys, gws: dict[str, str], sims: list[str]
                 ) -> dict[str, Any]:
    out: dict[str, Any] = {}
    raw: dict[str, list[dict[str, Any]]] = {}
    await reset(sims)
    idle = await Run(p, keys, gws["off"], False, sims).drive(p.idle_s)
    out["idle"] = summarize(idle, 0.0, p.idle_s)
    raw["idle"] = [asdict(s) for s in idle.samples]
    for mode in gws:
        await reset(sims)
        ph = await Run(p, keys, gws[mode], True, sims).drive(p.warmup_s + p.duration_s)
        out[mode] = summarize(ph, p.warmup_s, p.duration_s)
        raw[mode] = [asdict(s) for s in ph.samples]
    out["samples"] = raw
    return out


def modes(p: Params) -> dict[str, tuple[int | None, bool]]:
    """Phase name → (``max_inflight_per_replica``, first-token guard): ``off`` (None: flow
    control off), ``on`` (the engines' ``max-num-seqs``, guard on), ``on-noguard`` with
    ``--compare-guard``, and ``on@N`` for each N of ``--inflight-sweep``."""
    out: dict[str, tuple[int | None, bool]] = {"off": (None, False),
                                               "on": (p.max_num_seqs, True)}
    if p.compare_guard:
        out["on-noguard"] = (p.max_num_seqs, False)
    for n in filter(None, p.inflight_sweep.split(",")):
        out[f"on@{int(n)}"] = (int(n), True)
    return out


def run(p: Params) -> dict[str, Any]:
    """Start the replicas and the two gateways, run the three phases, stop everything."""
    procs = []
    keys = Keys()
    args = ("--max-num-seqs", str(p.max_num_seqs), "--output-tokens", str(p.batch_tokens),
            "--scheduling-policy", "priority")
    try:
        spawned = [spawn_simulator("standard", p.time_scale, p.seed + i, args, MODEL)
                   for i in range(p.replicas)]
        procs += [s.proc for s in spawned]
        sims = [s.wait_ready() for s in spawned]
        with tempfile.TemporaryDirectory(prefix="bench-flow-") as tmp:
            gws: dict[str, str] = {}
            for mode, spec in modes(p).items():
                cfg = Path(tmp) / f"{mode}.yaml"
                cfg.write_text(yaml.safe_dump(gateway_config(sims, keys, p, spec)))
                gw = start_gateway(str(cfg), str(Path(tmp) / f"{mode}.log"))
                procs.append(gw.proc)
                gws[mode] = gw.wait_ready("/readyz")
            install_loop()
            res = asyncio.run(phases(p, keys, gws, sims))
            res["params"] = asdict(p)
            res["verdict"] = verdict(res)
            return res
    finally:
        stop_processes(procs)


def verdict(res: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets, each with the measured figure."""
    idle, off, on = res["idle"], res["off"], res["on"]
    ratio = (on["interactive_ttft_p95_s"] / idle["interactive_ttft_p95_s"]
             if on["interactive_ttft_p95_s"] and idle["interactive_ttft_p95_s"] else None)
    tput = (on["output_tokens_per_s"] / off["output_tokens_per_s"]
            if on["output_tokens_per_s"] and off["output_tokens_per_s"] else None)
    good = (on["client_output_tokens_per_s"] / off["client_output_tokens_per_s"]
            if on["client_output_tokens_per_s"] and off["client_output_tokens_per_s"] else None)
    p = res["params"]
    fair_share = 1 / len(BATCH_KEYS)
    return {
        "interactive_p95_vs_idle": round(ratio, 2) if ratio else None,
        "interactive_p95_ok": ratio is not None and ratio <= 1.5,
        "throughput_on_vs_off": round(tput, 3) if tput else None,
        "throughput_ok": tput is not None and tput >= 0.95,
        "goodput_on_vs_off": round(good, 3) if good else None,
        "jain_on": on["jain_batch"], "jain_ok": (on["jain_batch"] or 0) >= 0.95,
        "flood_held_to_share": on["flood_share_prompt_and_output"] is not None
        and on["flood_share_prompt_and_output"] <= fair_share * 1.1,
        "shed_fast_ok": on["shed_slowest_ms"] is None or on["shed_slowest_ms"] <= 50,
        "shed_p95_ok": on["shed_p95_ms"] is None or on["shed_p95_ms"] <= 50,
        "shed_retry_after_ok": on["shed_with_retry_after"] == on["shed"],
        "no_hung": on["hung"] == 0 and off["hung"] == 0,
        "no_starvation": on["batch_queue_wait_max_s"] is None
        or on["batch_queue_wait_max_s"] <= p["max_wait_s"] + 10,
    }


def print_table(res: dict[str, Any]) -> None:
    cols = ("requests", "interactive_ttft_p50_s", "interactive_ttft_p95_s",
            "interactive_ttft_max_s", "interactive_engine_ttft_p95_s", "batch_ttft_p95_s",
            "output_tokens_per_s",
            "client_output_tokens_per_s", "jain_batch", "flood_share", "shed", "shed_p50_ms",
            "shed_p95_ms", "shed_slowest_ms", "shed_over_50ms", "shed_gateway_p50_ms",
            "shed_gateway_p95_ms", "shed_gateway_max_ms", "shed_gateway_over_50ms",
            "client_loop_lag_p95_ms", "client_loop_lag_max_ms", "gateway_slots_mean",
            "gateway_queue_mean",
            "timed_out_in_queue", "cut_by_deadline",
            "engine_running_mean", "engine_waiting_mean", "hung", "batch_queue_wait_max_s")
    names = [k for k in res if k == "idle" or k == "off" or k.startswith("on")]
    print(f"{'':<30}" + "".join(f"{n:>11}" for n in names))
    for col in cols:
        print(f"{col:<30}" + "".join(f"{res[n][col]!s:>11}" for n in names))
    for phase in names[1:]:
        print(f"{phase}: per key {res[phase]['keys']} errors {res[phase]['errors']} "
              f"gateway {res[phase]['gateway']}")
    print("verdict:", json.dumps(res["verdict"]))


def plot(res: dict[str, Any], path: str) -> None:
    """TTFT by band over time, flow control off and on (PNG at ``path``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    idle_p95 = res["idle"]["interactive_ttft_p95_s"]
    for ax, mode in zip(axes, ("off", "on"), strict=True):
        for band, color in (("batch", "tab:orange"), ("interactive", "tab:blue")):
            pts = [(s["start"], s["ttft"]) for s in res["samples"][mode]
                   if s["band"] == band and s["ttft"] is not None]
            ax.scatter([x for x, _ in pts], [y for _, y in pts], s=6, alpha=0.5, color=color,
                       label=band)
        if idle_p95:
            ax.axhline(idle_p95, color="tab:blue", ls="--", lw=1, label="interactive p95, idle")
        ax.set_yscale("log")
        ax.set_xlabel("seconds since the phase started")
        ax.set_title(f"flow control {mode}", fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("TTFT, s (log)")
    axes[1].legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def small_params() -> Params:
    """A short version for tests: the same shape, shorter windows."""
    return Params(idle_s=6.0, warmup_s=5.0, duration_s=20.0, drain_s=40.0)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    d = Params()
    for name, value in asdict(d).items():
        ap.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    ap.add_argument("--small", action="store_true", help="short windows (tests)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--plot", default=None, help="write the TTFT-by-band plot to this PNG")
    a = ap.parse_args(argv)
    p = small_params() if a.small else Params(**{k: getattr(a, k) for k in asdict(d)})
    res = run(p)
    if a.plot:
        plot(res, a.plot)
    if a.json:
        json.dump({k: v for k, v in res.items() if k != "samples"}, sys.stdout, indent=2)
        print()
    else:
        print_table(res)


if __name__ == "__main__":
    main()
