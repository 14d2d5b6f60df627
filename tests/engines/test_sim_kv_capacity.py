"""The simulator's KV capacity as vLLM shows it: ``vllm:cache_config_info`` and
``vllm:num_preemptions`` exported, capacity set in tokens or blocks, the start-up refusal when
one ``max_model_len`` sequence cannot fit, recompute preemption when decode blocks run out, and
the gateway's scraper reading all of it."""

from __future__ import annotations

import asyncio
import concurrent.futures

import httpx
import pytest

from engines.sim.cli import kv_refusal, parse_config
from engines.sim.engine import Engine, Job
from engines.sim.kvcache import PrefixCache
from engines.sim.metrics import SimMetrics
from engines.sim.perf import PerfModel
from engines.sim.testing import start_sim
from gateway.config import UpstreamConfig
from gateway.fleet.pools import Replica
from gateway.upstream.client import Upstream
from gateway.upstream.load_scraper import (
    KV_BLOCK_SIZE,
    KV_BLOCKS,
    PREEMPTIONS,
    LoadScraper,
    parse_engine_metrics,
)


def test_capacity_in_tokens_rounds_down_to_blocks() -> None:
    cfg = parse_config(["--kv-cache-tokens", "100000", "--block-size", "16",
                        "--max-model-len", "65536"])
    assert cfg.num_gpu_blocks == 6250
    assert parse_config(["--num-gpu-blocks", "300", "--max-model-len", "4800"]).num_gpu_blocks \
        == 300


def test_start_up_refusal_when_one_max_model_len_sequence_cannot_fit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert kv_refusal(2048, 16, 128) is None  # exactly one sequence fits
    assert "17 KV cache blocks are needed" in (kv_refusal(2049, 16, 128) or "")
    with pytest.raises(SystemExit) as e:
        parse_config(["--max-model-len", "1048576", "--kv-cache-tokens", "1000000"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "max seq len (1048576)" in err and "estimated maximum model length is 1000000" in err


def test_sim_exports_cache_config_and_the_gateway_scrapes_it() -> None:
    with start_sim(time_scale=0, model="m", num_gpu_blocks=4096, block_size=32,
                   max_model_len=65536) as sim:
        async def run() -> Replica:
            upstream = Upstream(UpstreamConfig())
            try:
                r = Replica(sim.url, "m/standard")
                await LoadScraper(None, upstream).scrape(r)  # type: ignore[arg-type]
                return r
            finally:
                await upstream.close()

        r = asyncio.run(run())
        values = parse_engine_metrics(httpx.get(sim.url + "/metrics").text)
    assert (values[KV_BLOCKS], values[KV_BLOCK_SIZE], values[PREEMPTIONS]) == (4096, 32, 0)
    assert (r.kv_num_blocks, r.kv_block_size, r.kv_tokens) == (4096, 32, 131_072)
    assert r.kv_cache_dtype == "auto" and r.max_model_len == 65536 and r.engine_preemptions == 0


async def _run_two(preemption: bool) -> tuple[int, list[int], int]:
    """Two requests of 64 prompt + 96 output tokens on a 16-block pool of 16 tokens (256
    tokens: both prompts fit, both outputs do not)."""
    metrics = SimMetrics("m", False, num_gpu_blocks=16, block_size=16)
    engine = Engine(PerfModel(), PrefixCache(16, 16), metrics, time_scale=0,
                    preemption=preemption)
    engine.start()
    try:
        jobs = []
        for _ in range(2):
            job = Job()
            job.add(0, 64, [], 96)
            jobs.append(job)
            engine.submit(job)

        async def drain(job: Job) -> int:
            n = 0
            while True:
                out = await job.next()
                n += sum(k for _, k, _ in out)
                if any(done for _, _, done in out):
                    return n

        got = await asyncio.wait_for(asyncio.gather(*(drain(j) for j in jobs)), 10)
        return engine.stats.preemptions, got, engine.cache.used_blocks
    finally:
        await engine.stop()


async def test_recompute_preemption_of_the_newest_when_blocks_run_out() -> None:
    preempted, got, used = await _run_two(preemption=True)
    # both were admitted (prompt blocks only) and outgrew the pool: the newest was preempted,
    # redone after the first finished, and every output token was delivered once
    assert preempted >= 1 and got == [96, 96] and used == 0
    reserved, got, _ = await _run_two(preemption=False)
    assert reserved == 0 and got == [96, 96]  # reserving up front: the second simply waited


def test_preemptions_are_exported() -> None:
    # real-time decode steps (time_scale 1: ~100 steps of vLLM's measured decode time per
    # request) so the three requests run side by side however the client threads are scheduled;
    # at time_scale 0 each finished before the next arrived on a loaded machine
    with start_sim(time_scale=1, model="m", num_gpu_blocks=16, block_size=16, max_model_len=256,
                   preemption=True, output_tokens=96) as sim:
        with httpx.Client(base_url=sim.url, timeout=30) as c:
            body = {"model": "m", "prompt": "word " * 60, "max_tokens": 96, "ignore_eos": True}
            with concurrent.futures.ThreadPoolExecutor(3) as pool:
                answers = list(pool.map(lambda _: c.post("/v1/completions", json=body),
                                        range(3)))
            assert all(a.status_code == 200 for a in answers)
            assert all(a.json()["usage"]["completion_tokens"] == 96 for a in answers)
            values = parse_engine_metrics(c.get("/metrics").text)
    assert values[PREEMPTIONS] >= 1
