"""OpenAI Responses API (``/v1/responses``) as a protocol, with its state owned by the gateway.

Request: ``model``, ``input`` (a string or items), ``instructions``, ``tools``,
``max_output_tokens``, ``stream``, ``store`` (default true), ``previous_response_id``,
``service_tier`` (the same tier hint as chat). Owned fields: ``model``; ``store`` (always false
upstream: the engine keeps nothing); ``request_id`` (vLLM's extra field that becomes the
response id: the gateway names each response ``resp_<32 hex>`` so it can track and cancel it);
``previous_response_id`` (expanded by the gateway into the full ``input`` and removed, engines
stay stateless). ``background: true`` is refused (400): it needs an engine-side store; so is
``conversation`` (400: state of OpenAI's Conversations API, which the gateway does not serve).

Stream (OpenAI API reference, "Responses streaming events"; vLLM 0.32
``entrypoints/openai/responses/streaming_events.py``): typed events ``response.created``,
``response.in_progress``, ``response.output_item.added``, ``response.content_part.added``,
``response.output_text.delta`` ... ``*.done``, ``response.completed`` (or ``.incomplete`` /
``.failed``) last; no ``[DONE]``. First content event: a delta (text, reasoning, function-call
arguments, refusal) or a function call item. Usage: ``response.usage`` of the terminal event
(``input_tokens``, ``input_tokens_details.cached_tokens``, ``output_tokens``). In-band errors
are the API's ``error`` event. The response object is rewritten: ``id`` the gateway's (an
engine that names its responses itself, ignoring ``request_id``, has its id kept in
``Turn.upstream_id`` for the cancel it is told), ``model`` back to the client's name,
``service_tier`` the tier that served, ``previous_response_id`` as the client sent it. A
response whose terminal event lists no ``output`` after its items were streamed is stored with
the items the client received (``response.output_item.done``).

Mid-stream resume (``responses.resume``): a stream broken inside a message item's text is
continued through the engine's ``/v1/chat/completions`` (``continuation_path``) and spliced
into the client's stream; the codec's ``framing`` keeps what that needs.

State (``responses.state.ResponsesState``, attribute ``state``): stored responses expand
``previous_response_id`` and answer ``GET``/``DELETE /v1/responses/{id}``; responses in flight
on this process can be cancelled (``POST /v1/responses/{id}/cancel``).
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson

from gateway.common.sse import SSEEvent
from gateway.common.usage import Usage
from gateway.errors import GatewayError, InvalidRequest, UpstreamError
from gateway.protocols.base import (
    CONTENT,
    DONE,
    ERROR,
    FRAME,
    HEAD_CONTENT,
    HEAD_ERROR,
    HEAD_FRAME,
    HEAD_MALFORMED,
    Protocol,
    Resumable,
    ResumePoint,
    Rewrite,
    StreamCodec,
    json_object,
    named_event,
)
from gateway.protocols.body import ParsedBody, load_json_object, splice_model
from gateway.protocols.error_shapes import RESPONSES_ERRORS, ErrorShape
from gateway.protocols.openai.chat import is_content as chat_is_content
from gateway.protocols.responses.items import (
    DELTA_EVENTS,
    chat_view,
    event_text,
    input_items,
    output_items_text,
)
from gateway.protocols.responses.resume import (
    CONTINUATION_PATH,
    Framing,
    ResponsesSplice,
    continuation_body,
    resume_point,
)
from gateway.protocols.responses.state import ResponsesState, Turn
from gateway.protocols.responses.store import ResponseStore
from gateway.telemetry.record import RequestRecord

TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
_HEAD_FRAMES = frozenset({
    "response.created", "response.in_progress", "response.queued",
    "response.content_part.added", "response.reasoning_part.added",
})


def responses_usage(u: Any) -> Usage | None:
    """``Usage`` of a Responses ``usage`` object (``input_tokens`` includes the cached ones)."""
    if not isinstance(u, dict):
        return None
    details = u.get("input_tokens_details")
    cached = (details.get("cached_tokens") if isinstance(details, dict) else 0) or 0
    prompt, completion = u.get("input_tokens") or 0, u.get("output_tokens") or 0
    if not all(type(v) is int and v >= 0 for v in (prompt, completion, cached)):
        return None
    return Usage(prompt, completion, min(cached, prompt))


def _rewrite_response(resp: dict[str, Any], rewrite: Rewrite, turn: Turn) -> None:
    """The engine's response object as the client gets it (module docstring)."""
    engine_id = resp.get("id")
    if isinstance(engine_id, str) and engine_id != turn.response_id:
        turn.upstream_id = engine_id  # the engine named it itself: kept for its cancel
    if "id" in resp:
        resp["id"] = turn.response_id
    if "model" in resp:
        resp["model"] = rewrite.client_model
    resp["service_tier"] = rewrite.service_tier
    if turn.previous_id is not None:
        resp["previous_response_id"] = turn.previous_id


def _engine_error(doc: dict[str, Any]) -> UpstreamError:
    """The client-facing error of an engine's ``error`` event or failed response: its message
    kept (never the rest of the document, which may hold output text)."""
    error = doc.get("error")
    inner: dict[str, Any] = error if isinstance(error, dict) else doc
    message = inner.get("message")
    return UpstreamError(f"engine error: {message if isinstance(message, str) else 'unknown'}")


class ResponsesStream(StreamCodec):
    """One Responses stream (module docstring); ``framing`` is what it relayed of the
    stream's framing (``responses.resume.Framing``: the last ``sequence_number`` seen, so a
    gateway error event continues the numbering, and what a mid-stream resume continues)."""

    __slots__ = ("framing", "rewrite", "turn")

    def __init__(self, rewrite: Rewrite, turn: Turn) -> None:
        super().__init__()
        self.rewrite, self.turn = rewrite, turn
        self.framing = Framing()

    def event(self, ev: SSEEvent) -> tuple[int, bytes]:
        data = ev.data
        assert data is not None
        doc = json_object(data)
        if doc is None:
            self.error = UpstreamError("engine sent a malformed event mid-stream")
            return ERROR, self.error_event(self.error)
        kind = doc.get("type")
        if kind in DELTA_EVENTS:
            seq = doc.get("sequence_number")
            if type(seq) is int:
                self.framing.seq = seq
            return CONTENT, named_event(kind, data)
        resp = doc.get("response")
        if isinstance(resp, dict):
            _rewrite_response(resp, self.rewrite, self.turn)
            data = orjson.dumps(doc)
            self.framing.observe(kind, doc)
            if kind in TERMINAL:
                self.usage = responses_usage(resp.get("usage"))
                if kind == "response.failed":
                    self.error = _engine_error(resp)
                    return ERROR, named_event(kind, data)
                if not resp.get("output") and self.framing.items:
                    # the items were streamed, the terminal event lists none: what is stored
                    # (and continued by previous_response_id) is what the client received
                    resp = {**resp, "output": list(self.framing.items)}
                self.final = resp
                return DONE, named_event(kind, data)
            return FRAME, named_event(kind, data)
        if kind == "error" or (kind is None and "error" in doc):
            self.error = _engine_error(doc)
            return ERROR, self.error_event(self.error)
        self.framing.observe(kind, doc)
        if kind == "response.output_item.added":
            item = doc.get("item")
            if isinstance(item, dict) and item.get("type") not in ("message", "reasoning"):
                return CONTENT, named_event(kind, data)
        return FRAME, named_event(kind, data)

    def error_event(self, err: GatewayError) -> bytes:
        return RESPONSES_ERRORS.event(err, self.framing.seq + 1)

    def continuation(self, point: ResumePoint, carried: list[int]) -> StreamCodec:
        return ResponsesSplice(self, self.framing, point, carried)

    def resume_blocker(self, point: ResumePoint) -> str | None:
        return self.framing.blocker(point)


class ResponsesProtocol(Protocol, Resumable):
    """``POST /v1/responses`` and the state behind ``GET``/``DELETE``/``cancel``."""

    name = "responses"
    lowers_output_cap = True
    prompt_field = "input"
    output_field = "max_output_tokens"
    path = "/v1/responses"
    continuation_path = CONTINUATION_PATH  # vLLM continues a prefill on chat only
    operation = "chat"
    errors: ErrorShape = RESPONSES_ERRORS

    def __init__(self, store: ResponseStore) -> None:
        self.state = ResponsesState(store)

    def span_attributes(self) -> dict[str, str]:
        return {"openai.api.type": "responses"}

    def parse(self, raw: bytes) -> ParsedBody:
        doc = load_json_object(raw)
        model = doc.get("model")
        if not isinstance(model, str) or not model:
            raise InvalidRequest("'model' must be a non-empty string", param="model")
        value = doc.get("input")
        if not isinstance(value, str | list) or (isinstance(value, list) and not all(
            isinstance(i, dict) for i in value
        )):
            raise InvalidRequest("'input' must be a string or an array of items", param="input")
        for name in ("stream", "store", "background"):
            if doc.get(name) is not None and not isinstance(doc[name], bool):
                raise InvalidRequest(f"'{name}' must be a boolean", param=name)
        if doc.get("background"):
            raise InvalidRequest(
                "background mode is not supported by this gateway", param="background"
            )
        if doc.get("conversation") is not None:
            raise InvalidRequest(
                "conversations are not supported by this gateway (no Conversations API): "
                "send the conversation as 'input' or use 'previous_response_id'",
                param="conversation",
            )
        previous = doc.get("previous_response_id")
        if previous is not None and (not isinstance(previous, str) or not previous):
            raise InvalidRequest(
                "'previous_response_id' must be a non-empty string", param="previous_response_id"
            )
        items = input_items(value)
        turn = Turn("resp_" + uuid.uuid4().hex, previous, doc.get("store") is not False, items)
        return ParsedBody(raw, doc, view=chat_view(doc, items), ext=turn)

    def service_tier(self, doc: dict[str, Any]) -> object:
        return doc.get("service_tier")

    async def prepare(self, body: ParsedBody, key_id: str | None) -> None:
        await self.state.expand(body, key_id)

    def running(self, body: ParsedBody, rec: RequestRecord) -> Any:
        return self.state.running(body, rec)

    def upstream_body(
        self, body: ParsedBody, served_model: str, priority: int | None = None
    ) -> bytes:
        turn: Turn = body.ext
        doc = body.doc
        if turn.full_input is None and not ({"store", "request_id"} & doc.keys()):
            raw = body.raw
            if doc["model"] != served_model:
                spliced = splice_model(raw, doc["model"], served_model)
                raw = spliced if spliced is not None else b""
            if raw:
                start = raw.index(b"{") + 1
                owned = b'{"request_id":' + orjson.dumps(turn.response_id) + b',"store":false,'
                return owned + raw[start:]
        up = {k: v for k, v in doc.items() if k != "previous_response_id"}
        up.update(model=served_model, store=False, request_id=turn.response_id)
        if turn.full_input is not None:
            up["input"] = turn.full_input
        return orjson.dumps(up)

    def head_kind(self, ev: SSEEvent) -> tuple[int, GatewayError | None]:
        name = ev.event
        if name is not None:  # the typed event line says it without a parse (the relay
            kind_name = name.decode("latin-1")  # still parses each one it forwards)
            if kind_name in _HEAD_FRAMES:
                return HEAD_FRAME, None
            if kind_name in DELTA_EVENTS:
                return HEAD_CONTENT, None
        doc = json_object(ev.data or b"")
        if doc is None:
            return HEAD_MALFORMED, None
        kind = doc.get("type")
        if kind is None and "choices" in doc:  # a continuation's chat chunk
            return (HEAD_CONTENT if chat_is_content(doc) else HEAD_FRAME), None
        if kind in _HEAD_FRAMES:
            return HEAD_FRAME, None
        if kind == "error" or (kind is None and "error" in doc):
            return HEAD_ERROR, _engine_error(doc)
        if kind == "response.failed":
            return HEAD_ERROR, _engine_error(doc.get("response") or doc)
        if kind == "response.output_item.added":
            item = doc.get("item")
            if isinstance(item, dict) and item.get("type") in ("message", "reasoning"):
                return HEAD_FRAME, None
        return HEAD_CONTENT, None

    def codec(self, body: ParsedBody, rewrite: Rewrite) -> StreamCodec:
        return ResponsesStream(rewrite, body.ext)

    def json_usage(self, doc: dict[str, Any]) -> Usage | None:
        return responses_usage(doc.get("usage"))

    def rewrite_json(self, doc: dict[str, Any], body: ParsedBody, rewrite: Rewrite) -> bytes:
        _rewrite_response(doc, rewrite, body.ext)
        return orjson.dumps(doc)

    async def finish(
        self, body: ParsedBody, key_id: str | None, final: dict[str, Any] | None
    ) -> None:
        if final:
            await self.state.save(body, key_id, final)

    def output_text(self, relayed: list[bytes]) -> str:
        return "".join(event_text(d) for d in map(json_object, relayed) if d is not None)

    def json_output_text(self, doc: dict[str, Any]) -> str:
        return output_items_text(doc.get("output"))

    def resume_point(self, body: ParsedBody, relayed: list[bytes]) -> ResumePoint:
        return resume_point(body, relayed)

    def continuation_body(
        self, body: ParsedBody, served_model: str, point: ResumePoint,
        priority: int | None = None,
    ) -> bytes:
        return continuation_body(body, served_model, point, priority, body.ext.full_input)
