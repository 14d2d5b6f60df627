"""OpenAI ``/v1/chat/completions`` and ``/v1/completions`` as protocols.

Stream: ``data: {chunk}`` events, ``data: [DONE]`` last; usage in a final ``"choices": []``
chunk when ``stream_options.include_usage`` (which the gateway sets on the client's behalf and
then strips, so it always has the engine's count). First content event: a chunk with text, a
tool call, reasoning, a refusal, a finish reason, usage or an error (the role chunk is not).
Owned fields: ``model`` (the engine's served name up, the client's name down),
``stream_options.include_usage``, and ``service_tier`` on every answer (the tier that served).

Per event the codec parses the chunk once (orjson, ~1-2 µs for a token chunk) to find usage,
errors and the model field; the rewrite itself is a byte splice (``ChunkRewriter``).
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.common.sse import DONE_EVENT, SSEEvent, encode_event
from gateway.common.usage import Usage
from gateway.errors import GatewayError, UpstreamError, stream_error
from gateway.protocols.base import (
    CONTENT,
    DONE,
    ERROR,
    HEAD_CONTENT,
    HEAD_ERROR,
    HEAD_FRAME,
    HEAD_MALFORMED,
    SKIP,
    Assembling,
    Protocol,
    Resumable,
    ResumePoint,
    Rewrite,
    StreamCodec,
    json_object,
)
from gateway.protocols.body import ParsedBody, parse_body, upstream_body
from gateway.protocols.error_shapes import OPENAI_ERRORS, ErrorShape
from gateway.protocols.openai.assemble import AssemblyCodec, assemble
from gateway.protocols.openai.resume import continuation_body, resume_point
from gateway.protocols.openai.splice import OpenAISplice, stream_ending
from gateway.telemetry.tokencount import completion_text, response_text

_MISSING = object()


class ChunkRewriter:
    """Rewrites engine JSON chunks for the client: ``model`` back to the client-facing name and
    ``service_tier`` set to the tier that served. Byte splices, no parse."""

    __slots__ = ("_model_new", "_model_old", "_renamed", "_tier_prefix", "client_model",
                 "service_tier")

    def __init__(self, served_model: str, client_model: str, service_tier: str) -> None:
        self.client_model = client_model
        self.service_tier = service_tier
        self._model_old = b'"model":' + orjson.dumps(served_model)
        self._model_new = b'"model":' + orjson.dumps(client_model)
        self._renamed = self._model_old != self._model_new
        self._tier_prefix = b'{"service_tier":' + orjson.dumps(service_tier) + b","

    def chunk(self, data: bytes, doc: dict[str, Any]) -> bytes:
        """Rewrite one SSE data payload whose parsed form is ``doc``: byte splices in the
        common case (compact JSON as vLLM writes it), re-serialised otherwise."""
        if self._renamed and doc.get("model") is not None:
            at = data.find(self._model_old)
            if at < 0:  # written some other way (spaces, escapes): re-serialised
                return self.body(doc)
            data = data[:at] + self._model_new + data[at + len(self._model_old) :]
        tier = doc.get("service_tier", _MISSING)
        if tier is _MISSING:
            if data[0] == 0x7B and data[1] == 0x22:  # '{"' (compact, a first key): spliced in
                return self._tier_prefix + data[1:]
            return self.body(doc)  # '{}', or whitespace before or inside the brace
        if tier != self.service_tier:
            return self.body(doc)
        return data

    def body(self, doc: dict[str, Any]) -> bytes:
        """Rewrite a non-streaming response document and serialise it."""
        if "model" in doc:
            doc["model"] = self.client_model
        doc["service_tier"] = self.service_tier
        return orjson.dumps(doc)


def engine_error(doc: dict[str, Any]) -> GatewayError:
    """The client-facing error for an engine's in-band ``{"error": {...}}`` event: the
    client's 4xx when its ``code`` says so, else 502 ``upstream_error`` (``stream_error``)."""
    return stream_error(doc)


def is_content(doc: dict[str, Any]) -> bool:
    """True for a chunk that carries output the client must not see twice: text, a tool
    call, a finish reason, usage (``choices: []``) or an in-band error."""
    if "error" in doc:
        return True
    choices = doc.get("choices")
    if not isinstance(choices, list) or not choices:
        return True
    for c in choices:
        if not isinstance(c, dict):
            return True
        if c.get("finish_reason") is not None or c.get("text"):
            return True
        delta = c.get("delta")
        if isinstance(delta, dict) and (
            delta.get("content") or delta.get("tool_calls") or delta.get("reasoning")
            or delta.get("reasoning_content") or delta.get("refusal")
        ):
            return True
    return False


class OpenAIStream(StreamCodec):
    """A chat or completions stream: every chunk but a stripped usage chunk is forwarded and
    counts as content (inter-token latency); ``[DONE]`` ends it. With ``strip_usage`` (the
    gateway asked for usage the client did not) no forwarded chunk carries ``usage``."""

    __slots__ = ("rewriter", "strip_usage")

    def __init__(self, rewriter: ChunkRewriter, *, strip_usage: bool) -> None:
        super().__init__()
        self.rewriter = rewriter
        self.strip_usage = strip_usage

    def event(self, ev: SSEEvent) -> tuple[int, bytes]:
        data = ev.data
        assert data is not None
        if ev.is_done:
            return DONE, DONE_EVENT
        doc = json_object(data)
        if doc is None:
            self.error = UpstreamError("engine sent a malformed event mid-stream")
            return ERROR, self.error_event(self.error)
        choices = doc.get("choices")
        if "error" in doc and not choices:
            self.error = engine_error(doc)
            return ERROR, self.error_event(self.error)
        usage = doc.get("usage")
        if usage is not None:
            # the usage chunk (``choices: []``), or usage on the finish chunk (servers other
            # than vLLM) or on every chunk (vLLM's continuous_usage_stats): the last wins
            self.usage = Usage.from_openai(usage) or self.usage
            if self.strip_usage:  # the gateway asked for it: the client sees none of it
                if not choices:
                    return SKIP, b""
                del doc["usage"]
                data = orjson.dumps(doc)
        return CONTENT, encode_event(self.rewriter.chunk(data, doc))

    def error_event(self, err: GatewayError) -> bytes:
        return OPENAI_ERRORS.event(err, 0)

    def continuation(self, point: ResumePoint, carried: list[int]) -> StreamCodec:
        return OpenAISplice(self, point, carried)

    def ending(self, usage: Usage | None, relayed: list[bytes]) -> bytes | None:
        return self.ending_after(self.usage, usage, relayed, (None, None))

    def ending_after(
        self, engine: Usage | None, usage: Usage | None, relayed: list[bytes],
        ident: tuple[str | None, int | None],
    ) -> bytes:
        """This stream's ending (``StreamCodec.ending``) when the codec that relayed last had
        seen ``engine`` usage: a usage chunk with ``usage`` only where the client asked for
        usage and the engine's never came, then ``[DONE]``."""
        report = usage if engine is None and not self.strip_usage else None
        return stream_ending(self.rewriter, relayed, report, ident)


class ChatProtocol(Protocol, Resumable, Assembling):
    """``POST /v1/chat/completions``."""

    name = "chat"
    lowers_output_cap = True
    path = "/v1/chat/completions"
    operation = "chat"
    errors: ErrorShape = OPENAI_ERRORS

    def span_attributes(self) -> dict[str, str]:
        return {"openai.api.type": "chat_completions"}

    def parse(self, raw: bytes) -> ParsedBody:
        return _assembled(parse_body(raw, "chat"))

    def service_tier(self, doc: dict[str, Any]) -> object:
        return doc.get("service_tier")

    def upstream_body(
        self, body: ParsedBody, served_model: str, priority: int | None = None
    ) -> bytes:
        return upstream_body(
            body, served_model,
            add_usage=body.upstream_stream and not (body.stream and body.client_wants_usage),
            priority=priority, stream=body.assemble,
        )

    def head_kind(self, ev: SSEEvent) -> tuple[int, GatewayError | None]:
        if ev.is_done:
            return HEAD_CONTENT, None
        doc = json_object(ev.data or b"")
        if doc is None:
            return HEAD_MALFORMED, None
        if "error" in doc and not doc.get("choices"):
            return HEAD_ERROR, engine_error(doc)
        return (HEAD_CONTENT if is_content(doc) else HEAD_FRAME), None

    def codec(self, body: ParsedBody, rewrite: Rewrite) -> StreamCodec:
        rewriter = ChunkRewriter(rewrite.served_model, rewrite.client_model, rewrite.service_tier)
        return OpenAIStream(rewriter, strip_usage=not body.client_wants_usage)

    def json_usage(self, doc: dict[str, Any]) -> Usage | None:
        return Usage.from_openai(doc.get("usage"))

    def rewrite_json(self, doc: dict[str, Any], body: ParsedBody, rewrite: Rewrite) -> bytes:
        return ChunkRewriter(
            rewrite.served_model, rewrite.client_model, rewrite.service_tier
        ).body(doc)

    def output_text(self, relayed: list[bytes]) -> str:
        return completion_text(relayed)

    def json_output_text(self, doc: dict[str, Any]) -> str:
        return response_text(doc)

    def assembler(self, body: ParsedBody, rewrite: Rewrite) -> StreamCodec | None:
        if not body.assemble:
            return None
        return AssemblyCodec(
            ChunkRewriter(rewrite.served_model, rewrite.client_model, rewrite.service_tier)
        )

    def assemble(self, relayed: list[bytes], usage: Usage | None) -> dict[str, Any]:
        return assemble(relayed, usage, chat=self.name == "chat")

    def resume_point(self, body: ParsedBody, relayed: list[bytes]) -> ResumePoint:
        return resume_point(body, relayed, chat=self.name == "chat")

    def continuation_body(
        self, body: ParsedBody, served_model: str, point: ResumePoint,
        priority: int | None = None,
    ) -> bytes:
        return continuation_body(body, served_model, point, chat=self.name == "chat",
                                 priority=priority)


class CompletionsProtocol(ChatProtocol):
    """``POST /v1/completions`` (legacy text completions)."""

    name = "completion"
    path = "/v1/completions"
    operation = "text_completion"
    count_kind = "completion"
    prompt_field = "prompt"

    def span_attributes(self) -> dict[str, str]:
        return {}

    def parse(self, raw: bytes) -> ParsedBody:
        return _assembled(parse_body(raw, "completion"))


def _assembled(body: ParsedBody) -> ParsedBody:
    """A non-stream request is streamed upstream and its JSON answer assembled by the gateway
    (``gateway.protocols.openai.assemble``): staged timeouts and resume apply to it too. Not
    one asking for ``prompt_logprobs``: vLLM refuses them with ``stream: true`` (its request
    validators in vllm/entrypoints/openai/protocol.py), so it goes upstream as JSON."""
    body.assemble = not body.stream and body.doc.get("prompt_logprobs") is None
    return body
