"""Fit and headroom: the fit filter, the chain check, the headroom scorer's table, and a bound
session that stays while its replica has KV room, moves when another has, waits when none has."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from gateway.config import PoolConfig, RoutingConfig
from gateway.fleet.pools import Pool, Replica
from gateway.routing import RouteRequest
from gateway.routing.fit import (
    ContextTooLong,
    capacity_tokens,
    check_chain,
    fits,
    free_kv_tokens,
)
from gateway.routing.pipeline import PoolRouter
from gateway.routing.scorers import SCORERS, ScoreContext
from gateway.routing.store import MemoryRoutingStore


def _pool(n: int, tier: str = "standard", blocks: int = 1000, max_len: int = 16_000) -> Pool:
    cfg = PoolConfig(endpoints=[f"http://10.0.{int(tier == 'fast')}.{i}:8000" for i in range(n)],
                     served_model_name="m", routing=RoutingConfig())
    p = Pool("m", tier, cfg)  # type: ignore[arg-type]
    p.replicas = [Replica(u, p.key, name=f"{p.key}/{i}", kv_num_blocks=blocks, kv_block_size=16,
                          max_model_len=max_len) for i, u in enumerate(cfg.endpoint_urls())]
    return p


def test_fits_checks_context_and_pool_and_ignores_the_unknown() -> None:
    r = Replica("http://a", "m/standard", kv_num_blocks=100, kv_block_size=16, max_model_len=4096)
    assert capacity_tokens(r) == 1600
    assert fits(r, 1600) and not fits(r, 1601)  # 101 blocks
    r.kv_num_blocks = 1000
    assert fits(r, 4096) and not fits(r, 4097)  # now max_model_len decides
    assert fits(Replica("http://b", "m/standard"), 10**9)  # nothing known: not excluded


def test_chain_keeps_pools_that_fit_and_refuses_with_the_numbers() -> None:
    fast, std = _pool(1, "fast", max_len=2048), _pool(2, max_len=8192)
    std.replicas[1].max_model_len = 65_536
    std.replicas[1].kv_num_blocks = 4096
    assert check_chain([fast, std], 1000) == [fast, std]
    assert check_chain([fast, std], 10_000) == [std]
    with pytest.raises(ContextTooLong) as e:
        check_chain([fast, std], 70_000)
    assert e.value.status == 400 and e.value.code == "context_length_exceeded"
    assert (e.value.prompt_tokens, e.value.output_tokens, e.value.limit) == (70_000, 0, 65_536)
    assert "maximum context length is 65536 tokens" in e.value.message
    assert "has 70000 input tokens" in e.value.message and e.value.param == "messages"
    with pytest.raises(ContextTooLong) as e:  # the prompt fits the largest; prompt + cap not
        check_chain([fast, std], 70_000, "input", 32_000, "max_output_tokens")
    assert (e.value.prompt_tokens, e.value.output_tokens, e.value.limit) == (38_000, 32_000, 65_536)
    assert e.value.param == "max_output_tokens"


def test_free_kv_is_capacity_minus_engine_use_or_gateway_commitment() -> None:
    r = _pool(1).replicas[0]  # 16,000 tokens
    now = time.monotonic()
    assert free_kv_tokens(r, now) == 16_000
    r.kv_cache_usage, r.engine_load_at = 0.25, now
    assert free_kv_tokens(r, now) == 12_000
    r.inflight_kv_tokens = 10_000  # our open attempts will grow to more than the engine shows
    assert free_kv_tokens(r, now) == 6_000
    r.engine_load_at = now - 10  # stale scrape: only our own commitment
    r.inflight_kv_tokens = 1_000
    assert free_kv_tokens(r, now) == 15_000
    assert free_kv_tokens(Replica("http://x", "m/standard"), now) is None


def test_headroom_scorer_table() -> None:
    rs = _pool(3).replicas
    rs[1].inflight_kv_tokens = 12_000  # 4,000 free
    rs[2].inflight_kv_tokens = 16_000  # none free
    ctx = ScoreContext(None, 0, list(rs), tokens=8_000, now=time.monotonic())
    assert SCORERS["headroom"](ctx, rs) == [1.0, 0.25, 0.0]
    ctx.tokens = 0
    assert SCORERS["headroom"](ctx, rs) == [1.0, 1.0, 1.0]


def _turn(router: PoolRouter, pool: Pool, tokens: int) -> Replica:
    doc = {"messages": [{"role": "user", "content": "task " * 400},
                        {"role": "assistant", "content": "ok"},
                        {"role": "user", "content": "more " * 400}]}
    route = RouteRequest.from_doc(doc, "sess-1")
    route.tokens = tokens

    async def pick() -> Replica:
        r = await router.pick(route, pool.replicas)
        await router.drain()
        assert r is not None
        return r

    r = asyncio.run(pick())
    _turn.placement = route.kv_placement  # type: ignore[attr-defined]
    _turn.figures = route.kv_figures  # type: ignore[attr-defined]
    return r


def test_session_stays_while_its_replica_has_room_moves_when_not_waits_when_none() -> None:
    pool = _pool(3)
    router = PoolRouter(pool, MemoryRoutingStore(), random.Random(1))
    home = _turn(router, pool, 2_000)
    assert _turn(router, pool, 2_000) is home and _turn.placement == "stay"  # type: ignore
    home.inflight_kv_tokens = 15_000  # other requests fill its pool
    moved = _turn(router, pool, 2_000)
    assert moved is not home and _turn.placement == "move"  # type: ignore
    assert router.decisions["kv-headroom"] == 1
    # home's pool is held by no attempt this gateway knows the end of: waiting is endless
    assert _turn.figures.endswith("wait_s=inf")  # type: ignore[attr-defined]
    assert router.placements["move"] == 1 and router.placements["stay"] == 1  # turn 1: new
    for r in pool.replicas:
        r.inflight_kv_tokens = 15_000  # nowhere has room: stay warm, the engine queues it
    assert _turn(router, pool, 2_000) is moved and _turn.placement == "wait"  # type: ignore
    assert _turn.figures.startswith("move_s=- ")  # type: ignore[attr-defined]  # nowhere to go
    assert router.placements["wait"] == 1


@pytest.mark.parametrize("prompt", [["word " * 2500] * 3, [[7] * 3000, [8] * 3000]])
def test_a_completions_batch_fits_by_its_longest_prompt(prompt: list) -> None:
    """``/v1/completions`` with a list of prompts is a batch of sequences, each under
    ``max_model_len`` on its own: three 2,500-token prompts on a 4,096-token replica fit (they
    were refused 400 "at least 4271 input tokens", their sum, as was a batch of two 3,000-id
    prompts as 6000); one prompt past the limit is still refused with its own count."""
    from types import SimpleNamespace

    from gateway.plan.chain import Plan
    from gateway.plan.kv_fit import fit_replicas

    api = SimpleNamespace(generates=True, count_kind="completion", prompt_field="prompt",
                          output_field="max_tokens", lowers_output_cap=False)

    async def fit(doc: dict) -> SimpleNamespace:
        pool = _pool(1, max_len=4096)
        plan, route = Plan(request=None, chain=[pool]), SimpleNamespace(tokens=0, output_cap=0)
        await fit_replicas(plan, route, SimpleNamespace(conversation=doc),  # type: ignore[arg-type]
                           len(str(doc)), api, "cl100k_base")  # type: ignore[arg-type]
        assert plan.chain == [pool]
        return route

    route = asyncio.run(fit({"prompt": prompt, "max_tokens": 16}))
    assert 2500 < route.tokens <= 3016  # the longest sequence and its cap
    with pytest.raises(ContextTooLong) as e:
        asyncio.run(fit({"prompt": [*prompt, "word " * 5000], "max_tokens": 16}))
    assert e.value.prompt_tokens > 4096 and e.value.param == "prompt"
