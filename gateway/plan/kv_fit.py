"""Fit at admission: the request's tokens (prompt + output cap) against each replica's
``max_model_len`` and KV pool, before any replica is asked (``gateway.routing.fit``)."""

from __future__ import annotations

from typing import Any, Literal, Protocol

import orjson

from gateway.plan.chain import Plan
from gateway.routing import RouteRequest
from gateway.routing.fit import (
    capacity_tokens,
    check_chain,
    largest_capacity,
    limits_known,
    smallest_capacity,
)
from gateway.routing.overflow import ContextTooLong
from gateway.telemetry.tokencount import PromptCount, count_prompt_upto_async

#: the body fields of an output cap (chat, completions; Responses' own field)
CAP_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


class ChatShaped(Protocol):
    """What fit reads of a parsed request body (``gateway.protocols.body.ParsedBody``): its
    conversation in chat shape; and what it rewrites when it drops the output cap: the
    document (``doc``), its chat view (``view``, None when ``doc`` is chat-shaped) and the
    bytes sent (``raw``)."""

    raw: bytes
    doc: dict[str, Any]
    view: dict[str, Any] | None

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
    @property
    def lowers_output_cap(self) -> bool: ...
    @property
    def name(self) -> str: ...


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
    tiktoken encoding of the estimate.

    A prompt that fits where prompt + cap does not is sent without its cap instead of refused
    when the API allows it (``lowers_output_cap``: chat, completions, Responses) and the model
    says ``output_cap_overflow: lower`` (``_lower_cap``); the Messages API keeps its refusal,
    which Claude Code answers by lowering ``max_tokens`` itself."""
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
    try:
        plan.chain = check_chain(plan.chain, route.tokens, protocol.prompt_field, cap,
                                 _output_param(protocol, body), at_least=counted.stopped)
    except ContextTooLong as e:
        if not _may_lower(e, plan, protocol):
            raise
        plan.chain = check_chain(plan.chain, e.prompt_tokens + 1, protocol.prompt_field)
        _lower_cap(plan, route, body, protocol, e)
    if plan.chain and plan.chain[0] is not first:
        plan.reason = "context-does-not-fit"


def _may_lower(e: ContextTooLong, plan: Plan, protocol: ClientApi) -> bool:
    """True when the overflow ``e`` is one of prompt + cap (the prompt leaves at least one
    output token on the largest replica) that this API and model answer by lowering the cap."""
    return (protocol.lowers_output_cap and e.output_tokens > 0
            and e.prompt_tokens < e.limit
            and plan.request.model.output_cap_overflow == "lower")


def _lower_cap(
    plan: Plan, route: RouteRequest, body: ChatShaped, protocol: ClientApi, e: ContextTooLong,
) -> None:
    """Send the request without its output cap, to the replicas its prompt fits (``plan.chain``
    already narrowed to them): chat and Responses engines then write up to ``max_model_len`` −
    the prompt counted with the model's own tokenizer (vLLM's default for an unset cap), so
    the request counts as up to each replica's context (``route.fills_context``). Completions
    get an explicit cap instead, the room the smallest of those replicas leaves by the
    gateway's count: vLLM's completions default is 16 tokens (OpenAI's), not the room.
    ``route.lowered_cap`` keeps the figures for the response header and the access log."""
    prompt = e.prompt_tokens
    route.lowered_cap = (e.output_tokens, prompt, e.limit)
    room: int | None = None
    if protocol.name == "completion":
        sizes = [c for p in plan.chain for r in p.replicas if (c := capacity_tokens(r)) > prompt]
        room = min(sizes, default=e.limit) - prompt
        route.tokens, route.output_cap = prompt + room, room
    else:
        route.tokens, route.output_cap, route.fills_context = prompt + 1, 1, True
    for doc in (body.doc, body.view):
        for name in CAP_FIELDS:
            if doc is not None:
                doc.pop(name, None)
    if room is not None:
        body.doc["max_tokens"] = room
    body.raw = orjson.dumps(body.doc)


def lowered_note(route: RouteRequest) -> str | None:
    """``lowered asked=B prompt=A max_model_len=C`` for a request sent with its output cap
    lowered (the ``x-speedgate-output-cap`` header, with ``;`` between the parts, and the
    access log's ``output_cap``), else None."""
    if route.lowered_cap is None:
        return None
    asked, prompt, limit = route.lowered_cap
    return f"lowered asked={asked} prompt={prompt} max_model_len={limit}"


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
