"""Fit: which replicas can hold a request at all. Pure.

A request of ``tokens`` tokens (prompt estimate + the output cap it asks for) fits a replica
when ``tokens ≤ max_model_len`` (from the engine's ``/v1/models``) and its KV blocks fit the
replica's pool (``cdiv(tokens, block_size) ≤ num_gpu_blocks``, from ``vllm:cache_config_info``):
the two checks vLLM itself makes, the first per request (a 400 for the context length) and the
second only at start-up for one ``max_model_len`` sequence, so a replica whose pool is smaller
than its ``max_model_len`` would take the request and never schedule it. Limits the gateway has
not learned yet (0) do not exclude a replica. A request that fits no replica of any pool of its
chain is refused before it is sent anywhere (``check_chain``).
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.fleet.pools import Pool, Replica
from gateway.routing.overflow import ContextTooLong

__all__ = ["ContextTooLong", "capacity_tokens", "check_chain", "fits", "fitting",
           "free_kv_tokens", "has_room", "limits_known", "smallest_capacity", "tokens_on"]


def capacity_tokens(r: Replica) -> int:
    """The longest sequence ``r`` takes in tokens: the smaller of its known ``max_model_len``
    and KV pool (``num_gpu_blocks × block_size``); 0 when neither is known."""
    known = [n for n in (r.max_model_len, r.kv_tokens) if n > 0]
    return min(known) if known else 0


def fits(r: Replica, tokens: int) -> bool:
    """True when a sequence of ``tokens`` tokens fits ``r`` (or its limits are unknown)."""
    if tokens <= 0:
        return True
    if r.max_model_len and tokens > r.max_model_len:
        return False
    if r.kv_num_blocks and r.kv_block_size:
        return -(-tokens // r.kv_block_size) <= r.kv_num_blocks
    return True


def tokens_on(r: Replica, tokens: int, fills_context: bool) -> int:
    """The tokens a request of ``tokens`` (prompt + output cap) holds on ``r`` at most. A
    request sent without its cap (``fills_context``) may write until the sequence reaches
    ``r``'s ``max_model_len`` (vLLM's default output cap: ``max_model_len`` − the prompt), so
    it counts as that there (as ``tokens`` while the limit is unknown)."""
    if fills_context and r.max_model_len:
        return max(tokens, r.max_model_len)
    return tokens


def free_kv_tokens(r: Replica, now: float, fresh_s: float = 3.0) -> int | None:
    """KV tokens ``r`` has free for one more request: capacity minus the larger of what the
    engine reports in use (``kv_cache_usage_perc × capacity``, while scraped within
    ``fresh_s`` s; other gateways' requests included) and what this gateway's open attempts
    hold or will still grow into (``inflight_kv_tokens``: their prompt + output caps). None
    when the capacity is unknown."""
    if not r.kv_tokens:
        return None
    used = r.kv_tokens * r.kv_cache_usage if now - r.engine_load_at <= fresh_s else 0.0
    return max(0, r.kv_tokens - int(max(used, r.inflight_kv_tokens)))


def has_room(r: Replica, tokens: int, now: float) -> bool:
    """True when ``tokens`` more fit ``r``'s free KV without preempting a running request (or
    the capacity or the request's size is unknown)."""
    free = free_kv_tokens(r, now)
    return tokens <= 0 or free is None or tokens <= free


def fitting(candidates: Sequence[Replica], tokens: int) -> list[Replica]:
    """The candidates ``tokens`` fits (all of them when ``tokens`` is 0: unknown)."""
    if tokens <= 0:
        return list(candidates)
    return [r for r in candidates if fits(r, tokens)]


def limits_known(chain: Sequence[Pool]) -> bool:
    """True when some replica of ``chain`` has a known limit (counting the request's tokens is
    only worth it then)."""
    return any(capacity_tokens(r) for pool in chain for r in pool.replicas)


def smallest_capacity(chain: Sequence[Pool]) -> int:
    """The smallest known ``capacity_tokens`` among the chain's replicas; 0 when none is
    known. A request no longer than it fits every replica whose limits are known."""
    known = [n for pool in chain for r in pool.replicas if (n := capacity_tokens(r))]
    return min(known, default=0)


def largest_capacity(chain: Sequence[Pool]) -> int:
    """The largest known ``capacity_tokens`` among the chain's replicas; 0 when none is
    known. A request longer than it fits no replica whose limits are known."""
    return max((capacity_tokens(r) for p in chain for r in p.replicas), default=0)


def check_chain(
    chain: Sequence[Pool], tokens: int, param: str = "messages", output_tokens: int = 0,
    output_param: str = "max_tokens", at_least: bool = False,
) -> list[Pool]:
    """The pools of ``chain`` (in order) with at least one replica ``tokens`` (prompt + output
    cap) fits. Raises ``ContextTooLong`` when there is none, naming the prompt's tokens
    (``tokens − output_tokens``), the output cap ``output_tokens``, the largest capacity among
    the chain's replicas, and ``param`` (the API's prompt field: ``messages``, ``prompt``,
    ``input``) when the prompt alone exceeds it, else ``output_param`` (the cap's field).
    ``at_least``: counting stopped once the prompt passed every replica's limit, so its
    count is a lower bound (said so in the OpenAI-shaped message)."""
    kept = [p for p in chain if fitting(p.replicas, tokens)]
    if kept or not chain:
        return kept
    raise ContextTooLong(max(0, tokens - output_tokens), output_tokens, largest_capacity(chain),
                         prompt_param=param, output_param=output_param, at_least=at_least)
