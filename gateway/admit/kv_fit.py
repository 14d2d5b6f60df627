"""Fit at admission: the request's tokens (prompt + output cap) against each replica's
``max_model_len`` and KV pool, before any replica is asked (``gateway.routing.fit``)."""

from __future__ import annotations

from gateway.admit.gate import estimate_tokens_upto, output_cap
from gateway.plan.chain import Plan
from gateway.protocols.base import Protocol
from gateway.protocols.body import ParsedBody
from gateway.routing import RouteRequest
from gateway.routing.fit import check_chain, largest_capacity, limits_known, smallest_capacity


async def fit_replicas(
    plan: Plan, route: RouteRequest, body: ParsedBody, raw_size: int, protocol: Protocol,
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
    the refusal names a lower bound (``estimate_tokens_upto``). ``encoding``: the tiktoken
    encoding of the estimate."""
    if not protocol.generates or not limits_known(plan.chain):
        return
    cap = output_cap(body.conversation)
    route.output_cap = cap
    if raw_size + cap <= smallest_capacity(plan.chain):
        route.tokens = raw_size // 4 + cap
        return
    counted = await estimate_tokens_upto(
        body.conversation, protocol.count_kind,  # type: ignore[arg-type]
        raw_size, encoding, largest_capacity(plan.chain),
    )
    route.tokens = counted.tokens
    first = plan.chain[0] if plan.chain else None
    plan.chain = check_chain(plan.chain, route.tokens, protocol.prompt_field, cap,
                             _output_param(protocol, body), at_least=counted.stopped)
    if plan.chain and plan.chain[0] is not first:
        plan.reason = "context-does-not-fit"


def _output_param(protocol: Protocol, body: ParsedBody) -> str:
    """The body field of the output cap, as the client spelled it (chat takes either
    ``max_tokens`` or ``max_completion_tokens``)."""
    if protocol.output_field == "max_tokens" and isinstance(
        body.conversation.get("max_completion_tokens"), int
    ):
        return "max_completion_tokens"
    return protocol.output_field
