"""Fit at admission: the request's tokens (prompt + output cap) against each replica's
``max_model_len`` and KV pool, before any replica is asked (``gateway.routing.fit``)."""

from __future__ import annotations

from typing import Any, Literal, Protocol

from gateway.plan.chain import Plan
from gateway.routing import RouteRequest
from gateway.routing.fit import check_chain, largest_capacity, limits_known, smallest_capacity
from gateway.telemetry.tokencount import PromptCount, count_prompt_upto_async


class ChatShaped(Protocol):
    """What fit reads of a parsed request body (``gateway.protocols.body.ParsedBody``): its
    conversation in chat shape."""

    @property
    def conversation(self) -> dict[str, Any]: ...


class ClientApi(Protocol):
    """What fit reads of a client API (``gateway.protocols.base.Protocol``): whether it
    generates, how its prompt is counted, and the body fields that hold the prompt and the
    output cap."""

    @property
    def generates(self) -> bool: ...
    @property
    def count_kind(self) -> str: ...
    @property
    def prompt_field(self) -> str: ...
    @property
    def output_field(self) -> str: ...


async def fit_replicas(
    plan: Plan, route: RouteRequest, body: ChatShaped, raw_size: int, protocol: ClientApi,
    encoding: str,
) -> None:
    """Count the request's tokens (prompt + output cap, into ``route.tokens``) when some
    replica of ``plan.chain`` has known limits, keep the pools where it fits (reason
    ``context-does-not-fit`` when the first tier is dropped) and let the picker skip the
    replicas it does not fit. Raises ``ContextTooLong`` (400 in the API's words, naming the
    prompt's tokens, the output cap and the limit, ``gateway.routing.overflow``) when it fits
    none. A body whose
    bytes (``raw_size``) plus output cap fit the smallest known replica (a token is at least
    one byte) is not counted: bytes / 4 (OpenAI's rule of thumb) serves the headroom scorer.
    Otherwise the count stops as soon as it passes the largest known capacity (past it no
    replica whose limits are known fits, whatever the exact count, and one whose limits are
    unknown takes any): a prompt that cannot fit costs about that many tokens' encoding, and
    the refusal names a lower bound (``estimate_tokens_upto``). A completions batch is
    counted per prompt and fits by its longest (``batch_sequences``). ``encoding``: the
    tiktoken encoding of the estimate."""
    if not protocol.generates or not limits_known(plan.chain):
        return
    cap = output_cap(body.conversation)
    route.output_cap = cap
    if raw_size + cap <= smallest_capacity(plan.chain):
        route.tokens = raw_size // 4 + cap
        return
    largest = largest_capacity(plan.chain)
    docs = batch_sequences(body.conversation, protocol.count_kind) or [body.conversation]
    counted = PromptCount(0, False)
    for doc in docs:  # a batch fits when its longest sequence does
        got = await estimate_tokens_upto(doc, protocol.count_kind,  # type: ignore[arg-type]
                                         raw_size, encoding, largest)
        if got.tokens > counted.tokens:
            counted = got
    route.tokens = counted.tokens
    first = plan.chain[0] if plan.chain else None
    plan.chain = check_chain(plan.chain, route.tokens, protocol.prompt_field, cap,
                             _output_param(protocol, body), at_least=counted.stopped)
    if plan.chain and plan.chain[0] is not first:
        plan.reason = "context-does-not-fit"


def batch_sequences(doc: dict[str, Any], kind: str) -> list[dict[str, Any]] | None:
    """A ``/v1/completions`` batch (``prompt`` a list of two or more strings or token-id
    lists: each is a sequence of its own, generated and limited by ``max_model_len`` apart) as
    one document per prompt; None for a single prompt or another API. Its prompts' tokens add
    up for usage and rate limits, but fit is per sequence."""
    prompt = doc.get("prompt") if kind == "completion" else None
    if (not isinstance(prompt, list) or len(prompt) < 2
            or not all(isinstance(p, str | list) for p in prompt)):
        return None
    return [{**doc, "prompt": p} for p in prompt]


def _output_param(protocol: ClientApi, body: ChatShaped) -> str:
    """The body field of the output cap, as the client spelled it (chat takes either
    ``max_tokens`` or ``max_completion_tokens``)."""
    if protocol.output_field == "max_tokens" and isinstance(
        body.conversation.get("max_completion_tokens"), int
    ):
        return "max_completion_tokens"
    return protocol.output_field


async def estimate_tokens(
    doc: dict[str, Any], kind: Literal["chat", "completion"], raw_size: int, encoding: Any
) -> int:
    """Tokens to reserve at admission: the prompt counted with tiktoken plus the output cap
    the client set (``max_completion_tokens`` or ``max_tokens``; 0 when unset)."""
    return (await estimate_tokens_upto(doc, kind, raw_size, encoding, None)).tokens


async def estimate_tokens_upto(
    doc: dict[str, Any], kind: Literal["chat", "completion"], raw_size: int, encoding: Any,
    limit: int | None,
) -> PromptCount:
    """``estimate_tokens`` with the prompt counted no further than needed to prove the prompt
    alone passes ``limit`` (None: all of it; ``count_prompt_upto``): ``stopped`` True when
    counting stopped there, ``tokens`` (prompt + output cap) then holding a lower bound of the
    prompt that is more than ``limit``. A prompt within ``limit`` is counted exactly, so an
    overflow of prompt + cap names the exact prompt (the number an agent lowers its output
    cap by)."""
    cap = output_cap(doc)
    try:
        got = await count_prompt_upto_async(doc, kind, limit, size_hint=raw_size,
                                            encoding=encoding)
    except Exception:  # an odd body shape must not fail admission: bytes / 4 (OpenAI's rule)
        got = PromptCount(raw_size // 4, False)
    return PromptCount(got.tokens + cap, got.stopped)


def output_cap(doc: dict[str, Any]) -> int:
    """The output tokens a chat-shaped body asks for at most (``max_completion_tokens`` or
    ``max_tokens``; 0 when unset or invalid, at most 10M)."""
    cap = doc.get("max_completion_tokens", doc.get("max_tokens"))
    out = cap if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0 else 0
    return min(out, 10_000_000)
