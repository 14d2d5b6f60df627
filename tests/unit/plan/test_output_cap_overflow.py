"""Fit decisions when the output cap is what does not fit: the table of API × setting × size
(served as asked, sent without its cap, refused naming the cap, refused naming the prompt), what
the body sent upstream then holds, and how the request is counted on each replica."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from gateway.config import ModelConfig, PoolConfig, RoutingConfig
from gateway.fleet.pools import Pool, Replica
from gateway.plan.chain import Plan
from gateway.plan.kv_fit import fit_replicas, lowered_note
from gateway.plan.tiers import TierRequest
from gateway.protocols.base import Protocol
from gateway.protocols.messages.protocol import MessagesProtocol
from gateway.protocols.openai.chat import ChatProtocol, CompletionsProtocol
from gateway.protocols.responses.protocol import ResponsesProtocol
from gateway.protocols.responses.store import MemoryResponseStore
from gateway.routing import RouteRequest
from gateway.routing.fit import tokens_on
from gateway.routing.overflow import ContextTooLong
from gateway.routing.scorers import SCORERS, ScoreContext

LIMIT = 2048  # the larger pool's max_model_len; the smaller one takes 1024


def _pool(tier: str, max_len: int) -> Pool:
    cfg = PoolConfig(endpoints=[f"http://10.0.{int(tier == 'fast')}.1:8000"],
                     served_model_name="m", routing=RoutingConfig())
    p = Pool("m", tier, cfg)  # type: ignore[arg-type]
    p.replicas = [Replica(u, p.key, name=f"{p.key}/0", kv_num_blocks=10_000, kv_block_size=16,
                          max_model_len=max_len) for u in cfg.endpoint_urls()]
    return p


def _plan(mode: str) -> Plan:
    cfg = PoolConfig(endpoints=["http://10.0.0.1:8000"], served_model_name="m")
    model = ModelConfig(tiers={"fast": cfg, "standard": cfg}, output_cap_overflow=mode)
    return Plan(TierRequest("m", model, "fast", "header"),
                [_pool("fast", 1024), _pool("standard", LIMIT)])


def _protocol(api: str) -> Protocol:
    if api == "responses":
        return ResponsesProtocol(MemoryResponseStore(ttl_s=60, max_record_bytes=1 << 20,
                                                     max_entries=10))
    return {"chat": ChatProtocol, "completions": CompletionsProtocol,
            "messages": MessagesProtocol}[api]()


def _body(api: str, words: int, cap: int) -> dict[str, Any]:
    text = "hello " * words
    if api == "completions":
        return {"model": "m", "prompt": text, "max_tokens": cap}
    if api == "responses":
        return {"model": "m", "input": text, "max_output_tokens": cap}
    if api == "chat":
        return {"model": "m", "messages": [{"role": "user", "content": text}],
                "max_completion_tokens": cap}
    return {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": cap}


async def _fit(api: str, mode: str, words: int, cap: int) -> tuple[Plan, RouteRequest, Any]:
    protocol = _protocol(api)
    raw = orjson.dumps(_body(api, words, cap))
    body = protocol.parse(raw)
    await protocol.prepare(body, None)
    plan, route = _plan(mode), RouteRequest.from_doc(body.conversation, None)
    plan.route = route
    await fit_replicas(plan, route, body, len(raw), protocol, "cl100k_base")
    return plan, route, body


# (api, setting, prompt words ≈ tokens, cap) → served | lowered | refused-cap | refused-prompt
TABLE = [
    ("chat", "lower", 900, 500, "served"),  # fits both pools as asked
    ("chat", "lower", 1500, 200, "served"),  # fits the larger pool as asked
    ("chat", "lower", 1500, 1000, "lowered"),
    ("chat", "refuse", 1500, 1000, "refused-cap"),
    ("chat", "lower", 2100, 1000, "refused-prompt"),  # the prompt alone is too long
    ("completions", "lower", 1500, 1000, "lowered"),
    ("responses", "lower", 1500, 1000, "lowered"),
    ("responses", "refuse", 1500, 1000, "refused-cap"),
    ("messages", "lower", 1500, 1000, "refused-cap"),  # Anthropic's refusal, always
    ("messages", "lower", 2100, 1000, "refused-prompt"),
]


@pytest.mark.parametrize(("api", "mode", "words", "cap", "outcome"), TABLE)
def test_fit_decisions(api: str, mode: str, words: int, cap: int, outcome: str) -> None:
    if outcome.startswith("refused"):
        with pytest.raises(ContextTooLong) as e:
            asyncio.run(_fit(api, mode, words, cap))
        assert e.value.prompt_only == (outcome == "refused-prompt")
        assert e.value.limit == LIMIT
        return
    plan, route, body = asyncio.run(_fit(api, mode, words, cap))
    assert (route.lowered_cap is not None) == (outcome == "lowered")
    if outcome == "served":
        return
    assert [p.tier for p in plan.chain] == ["standard"]  # only where the prompt fits
    asked, prompt, limit = route.lowered_cap  # type: ignore[misc]
    assert (asked, limit) == (cap, LIMIT) and words <= prompt < LIMIT
    assert lowered_note(route) == f"lowered asked={cap} prompt={prompt} max_model_len={LIMIT}"
    sent = orjson.loads(body.raw)
    assert sent == body.doc and not {"max_completion_tokens", "max_output_tokens"} & sent.keys()
    if api == "completions":  # vLLM's completions default is 16 tokens: the room, explicitly
        assert sent["max_tokens"] == LIMIT - prompt == route.output_cap
        assert route.tokens == LIMIT and not route.fills_context
    else:  # the engine's own default: max_model_len − the prompt
        assert "max_tokens" not in sent and "max_tokens" not in body.conversation
        assert route.fills_context and route.tokens == prompt + 1


def test_a_lowered_request_counts_as_each_replicas_whole_context() -> None:
    _, route, _ = asyncio.run(_fit("chat", "lower", 1500, 1000))
    small = Replica("http://a", "m/standard", kv_num_blocks=1000, kv_block_size=16,
                    max_model_len=LIMIT)
    big = Replica("http://b", "m/standard", kv_num_blocks=1000, kv_block_size=16,
                  max_model_len=12_000)
    assert tokens_on(small, route.tokens, route.fills_context) == LIMIT
    assert tokens_on(big, route.tokens, route.fills_context) == 12_000
    assert tokens_on(big, route.tokens, False) == route.tokens
    unknown = Replica("http://c", "m/standard")
    assert tokens_on(unknown, route.tokens, True) == route.tokens
    # headroom: 10,000 free KV tokens hold the small replica's context, not the big one's
    for r in (small, big):
        r.inflight_kv_tokens = 16_000 - 10_000
    ctx = ScoreContext(None, 0, [], tokens=route.tokens, fills_context=True)
    assert SCORERS["headroom"](ctx, [small, big]) == [1.0, pytest.approx(0.5 * 10_000 / 12_000)]
    ctx.fills_context = False  # counted as the prompt alone, both would look roomy
    assert SCORERS["headroom"](ctx, [small, big]) == [1.0, 1.0]
