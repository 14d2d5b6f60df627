"""The protocols one gateway serves, by path (``build_protocols``)."""

from __future__ import annotations

from gateway.config import GatewayConfig
from gateway.protocols.base import Protocol
from gateway.protocols.messages.protocol import CountTokensProtocol, MessagesProtocol
from gateway.protocols.openai.chat import ChatProtocol, CompletionsProtocol
from gateway.protocols.responses.cancel import CancelBus
from gateway.protocols.responses.protocol import ResponsesProtocol
from gateway.protocols.responses.store import (
    MemoryResponseStore,
    RedisResponseStore,
    ResponseStore,
)
from gateway.protocols.responses.tokens import InputTokensProtocol


def response_store(config: GatewayConfig) -> ResponseStore:
    """The Responses state store of ``config``: Redis when ``state.redis_url`` is set (shared
    by every gateway replica), else this process's memory."""
    rc = config.responses
    if config.state.redis_url:
        return RedisResponseStore.from_url(
            config.state.redis_url,
            timeout_s=rc.redis_timeout_s,
            prefix=rc.redis_prefix,
            ttl_s=rc.store_ttl_s,
            max_record_bytes=rc.max_response_bytes,
        )
    return MemoryResponseStore(
        ttl_s=rc.store_ttl_s,
        max_record_bytes=rc.max_response_bytes,
        max_entries=rc.memory_max_responses,
        max_bytes=rc.memory_max_bytes,
    )


def build_protocols(store: ResponseStore) -> dict[str, Protocol]:
    """Every served protocol by its path; the Responses protocol keeps its state in ``store``."""
    responses = ResponsesProtocol(store)
    protocols: list[Protocol] = [
        ChatProtocol(),
        CompletionsProtocol(),
        responses,
        InputTokensProtocol(responses),
        MessagesProtocol(),
        CountTokensProtocol(),
    ]
    return {p.path: p for p in protocols}


def cancel_bus(config: GatewayConfig) -> CancelBus | None:
    """The cross-gateway cancel channel when ``state.redis_url`` is set, else None."""
    if not config.state.redis_url:
        return None
    rc = config.responses
    return CancelBus.from_url(
        config.state.redis_url, timeout_s=rc.redis_timeout_s, prefix=rc.redis_prefix
    )


def longest_deadline_s(config: GatewayConfig) -> float:
    """The longest total deadline of any pool (seconds): no request runs longer."""
    return max(p.timeouts.total_s for m in config.models.values() for p in m.tiers.values())

