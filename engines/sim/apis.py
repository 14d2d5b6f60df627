"""The client APIs the simulator serves, as vLLM 0.32 does, each described by an ``Api``: how
its body becomes the chat (or completions) request the engine plans from, how it answers
(stream and JSON), how its errors look and what its response id is. One handler
(``engines.sim.completions.handle``) serves them all, so faults, the engine model and the
request log work the same for every API.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from engines.sim import messages_api, responses_api
from engines.sim import protocol as P
from engines.sim.request import RequestContext
from engines.sim.responder import respond_full, respond_stream

Deliveries = AsyncIterator[list[tuple[int, int, bool]]]
Responder = Callable[[web.Request, RequestContext, Deliveries], Awaitable[web.StreamResponse]]


def _same(body: dict[str, Any]) -> dict[str, Any]:
    return body


def _no_id(body: dict[str, Any]) -> str | None:
    return None


@dataclass(frozen=True, slots=True)
class Api:
    """One API: ``chat`` (the prompt is a conversation, else a completions prompt),
    ``to_chat`` (the body in the form the engine plans from; raises ``RequestError``),
    ``stream`` / ``full`` responders, ``error_body`` (vLLM's error shape for it) and ``rid``
    (the response id the body asks for, None: the API's default)."""

    name: str
    chat: bool
    to_chat: Callable[[dict[str, Any]], dict[str, Any]]
    stream: Responder
    full: Responder
    error_body: Callable[..., bytes]
    rid: Callable[[dict[str, Any]], str | None]


CHAT = Api("chat", True, _same, respond_stream, respond_full, P.error_body, _no_id)
COMPLETION = Api("completion", False, _same, respond_stream, respond_full, P.error_body, _no_id)
RESPONSES = Api(
    "responses", True, responses_api.to_chat, responses_api.respond_stream,
    responses_api.respond_full, P.error_body, responses_api.response_id,
)
MESSAGES = Api(
    "messages", True, messages_api.to_chat, messages_api.respond_stream,
    messages_api.respond_full, messages_api.error_body, _no_id,
)
