"""``POST /v1/responses/input_tokens``: the input tokens a Responses request would use.

Body: a Responses request (``model``, ``input``, ``instructions``, ``tools``,
``previous_response_id``: expanded from the gateway's store as for ``POST /v1/responses``).
Answer (OpenAI API reference, "Responses: get input token counts"):
``{"object": "response.input_tokens", "input_tokens": N}``.

Counted the way ``/v1/messages/count_tokens`` is: by a replica of the model's default pool,
with the engine's own tokenizer and chat template. vLLM 0.32 has no such Responses endpoint, so
the request goes to the replica's ``POST /tokenize`` (``vllm/entrypoints/serve/tokenize``:
``{"model", "messages", "tools"}`` → ``{"count", ...}``) as its chat-shaped conversation (the
same view the gateway routes and estimates by); function tools become chat tools, other tool
kinds (hosted tools the engine cannot run) are not counted. No output, no usage, no stored
response.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import orjson

from gateway.common.usage import Usage
from gateway.errors import UpstreamError
from gateway.protocols.base import Rewrite, Running
from gateway.protocols.body import ParsedBody
from gateway.protocols.responses.protocol import ResponsesProtocol
from gateway.telemetry.record import RequestRecord


def chat_tools(tools: Any) -> list[dict[str, Any]]:
    """Responses function tools (``{"type": "function", "name", "parameters", ...}``) as chat
    tools (``{"type": "function", "function": {...}}``); other kinds dropped."""
    out: list[dict[str, Any]] = []
    for t in tools if isinstance(tools, list) else ():
        if isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("name"), str):
            fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if k in t}
            out.append({"type": "function", "function": fn})
    return out


class InputTokensProtocol(ResponsesProtocol):
    """``POST /v1/responses/input_tokens`` (module docstring); shares the Responses state (to
    expand ``previous_response_id``) with the ``/v1/responses`` protocol it is built from."""

    name = "input_tokens"
    path = "/v1/responses/input_tokens"
    upstream_path = "/tokenize"
    operation = "count_tokens"
    generates = False
    default_tier_only = True

    def __init__(self, responses: ResponsesProtocol) -> None:
        self.state = responses.state

    def parse(self, raw: bytes) -> ParsedBody:
        body = super().parse(raw)
        body.doc.pop("stream", None)  # counting never streams
        return body

    @contextlib.asynccontextmanager
    async def running(self, body: ParsedBody, rec: RequestRecord) -> AsyncIterator[Running]:
        yield Running()  # nothing to cancel: no response is made

    def upstream_body(
        self, body: ParsedBody, served_model: str, priority: int | None = None
    ) -> bytes:
        view = body.conversation
        doc: dict[str, Any] = {"model": served_model, "messages": view["messages"],
                               "add_generation_prompt": True}
        tools = chat_tools(body.doc.get("tools"))
        if tools:
            doc["tools"] = tools
        return orjson.dumps(doc)

    def json_usage(self, doc: dict[str, Any]) -> Usage | None:
        return None

    def rewrite_json(self, doc: dict[str, Any], body: ParsedBody, rewrite: Rewrite) -> bytes:
        count = doc.get("count")
        if type(count) is not int or count < 0:
            raise UpstreamError("engine answered /tokenize without a token count")
        return orjson.dumps({"object": "response.input_tokens", "input_tokens": count})

    async def finish(
        self, body: ParsedBody, key_id: str | None, final: dict[str, Any] | None
    ) -> None:
        """Nothing is stored."""
