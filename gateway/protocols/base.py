"""What every client API must say about itself (``Protocol``) and about one stream
(``StreamCodec``), so the handler, the attempt and the relay stay protocol-blind.

A protocol is stateless and shared by all requests of its path; per-request state lives in the
``ParsedBody`` it returns (``view``, ``session_hint``, ``ext``) and in the ``StreamCodec`` it
makes for one stream. The request path asks, in order:

1. ``parse(raw)`` → ``ParsedBody`` (400 ``InvalidRequest`` in the API's words);
2. ``service_tier(doc)`` (the body's tier hint in OpenAI's vocabulary, or None),
   ``max_output_tokens(doc)``; ``body.view`` is the conversation in chat shape for routing keys,
   token estimates and the auto tier;
3. ``await prepare(body, key_id)`` (e.g. expand ``previous_response_id``) and
   ``running(body, rec)`` around the attempt and the relay (e.g. the in-flight table for cancel);
4. ``upstream_body(body, served_model)``: the bytes sent to the engine;
5. ``head_kind(event)`` while waiting for the first content event (TTFT; retries end there);
6. ``codec(body, rewrite)`` for a stream, or ``json_usage`` + ``rewrite_json`` for a JSON answer;
7. ``await finish(body, key_id, final_doc)`` for a successful answer (e.g. store it), before
   the bytes carrying its final response object reach the client (the JSON body, a stream's
   last event), so a next turn sent the moment the client has it finds it;
8. ``output_text`` / ``json_output_text`` when the engine reported no usage (tiktoken estimate);
   ``error_shapes`` shapes every error the gateway answers.
"""

from __future__ import annotations

import contextlib
import typing
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import orjson

from gateway.common.sse import SSEEvent, encode_event
from gateway.common.usage import Usage
from gateway.errors import GatewayError
from gateway.plan.tiers import TIER_TO_SERVICE_TIER
from gateway.protocols.body import ParsedBody

if TYPE_CHECKING:
    from gateway.protocols.error_shapes import ErrorShape
    from gateway.telemetry.record import RequestRecord

# Verdicts of ``StreamCodec.event``: what the relay does with one engine event.
SKIP = 0  # drop it (a usage chunk the client did not ask for)
FRAME = 1  # forward it; not output (e.g. response.created, message_start, ping, *.done)
CONTENT = 2  # forward it; output (inter-token latency tick; counted when usage is estimated)
DONE = 3  # forward it; the stream is complete
ERROR = 4  # the stream failed (``codec.error``); forward the returned bytes and stop

# ``Protocol.head_kind``: an event read before anything reached the client.
HEAD_FRAME = 0  # not a first token (role chunk, response.created, message_start, comments)
HEAD_CONTENT = 1  # the first content event: TTFT ends, the attempt is committed
HEAD_ERROR = 2  # the engine reported an error in-band before any output (retryable)
HEAD_MALFORMED = 3  # not an event of this protocol (retryable)


@dataclass(slots=True)
class Rewrite:
    """How an engine's answer is rewritten for the client: ``served_model`` (the engine's name)
    back to ``client_model``, the ``tier`` that served (``fast`` | ``standard``) and whether
    the request was a ``flex`` one (OpenAI's flex tier, served by the standard pool)."""

    served_model: str
    client_model: str
    tier: str
    flex: bool = False

    @property
    def service_tier(self) -> str:
        """The serving tier in OpenAI's ``service_tier`` vocabulary (``priority``/``default``,
        ``flex`` for a flex request the standard pool served)."""
        if self.flex and self.tier == "standard":
            return "flex"
        return TIER_TO_SERVICE_TIER[self.tier]


_EVENT_NAMES: dict[str, bytes] = {}  # ``type`` -> ``event:`` name, built as types are seen
_MAX_EVENT_NAMES = 256  # bound on that cache: an upstream inventing types cannot grow it


def named_event(kind: object, data: bytes) -> bytes:
    """One SSE event of a typed-event API (Messages, Responses) named from its JSON ``type``
    (``kind``): ``event: <type>`` then the ``data:`` line(s), whatever ``event:`` line the
    upstream wrote or left out (the official SDKs dispatch on the name; an upstream writing
    bare ``data:`` lines would otherwise stream nameless events). No ``event:`` line when
    ``type`` is not a string (the event is the codec's to judge)."""
    if type(kind) is not str:
        return encode_event(data)
    name = _EVENT_NAMES.get(kind)
    if name is None:
        name = kind.encode()
        if b"\n" in name or b"\r" in name:  # a name cannot hold a line break: left out
            return encode_event(data)
        if len(_EVENT_NAMES) < _MAX_EVENT_NAMES:
            _EVENT_NAMES[kind] = name
    return b"event: " + name + b"\n" + encode_event(data)


def json_object(data: bytes) -> dict[str, Any] | None:
    """``data`` parsed as a JSON object, or None when it is not one."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None


@dataclass(slots=True)
class ResumePoint:
    """What a broken stream already gave the client, rebuilt from the relayed payloads only
    when it broke (``Protocol.resume_point``): the assistant ``text`` and ``reasoning`` so far,
    ``tokens`` (output tokens relayed: the engine's count is unknown, the gateway's estimate),
    the stream's ``id`` and ``created`` as the client saw them, and ``blocker``: why it cannot
    be continued (None: it can) — ``protocol`` (the API has no continuation), ``n>1``,
    ``tool-call`` (a tool call had started: its arguments cannot be continued), ``finished``
    (a finish reason was relayed), ``echo``, ``prompt`` (not a single text prompt),
    ``structured-output`` (a JSON schema, regex, choice or grammar constrains the output: the
    engine's grammar would start again at the continuation, so the whole would not match);
    Messages and Responses add ``thinking`` (the break cut a thinking block / reasoning item)
    and ``block-closed`` (the cut text block / message item was already closed for the client,
    ``StreamCodec.resume_blocker``).
    ``complete``: a finish reason was relayed for every one of the request's choices (the
    engine ended the generation; only its usage report and end marker can be missing).
    ``heal``: the end of the relayed ``heal_field`` text (``content`` or ``reasoning``) left out
    of the continuation's prompt and expected again at the start of its output (token healing:
    a word cut mid-way does not re-tokenize into the tokens the engine produced, so the engine
    regenerates it from a word boundary and the splice drops what the client already has);
    empty: the whole text is carried. ``carried_tokens``: the engine's own count of the
    carried text (``carried()``, vLLM's ``/tokenize``), set by the continuation when the engine
    answered it; None: the continuation shrinks the output limit by the estimate instead."""

    text: str = ""
    reasoning: str = ""
    heal: str = ""
    heal_field: str = "content"
    tokens: int = 0
    id: str | None = None
    created: int | None = None
    blocker: str | None = None
    complete: bool = False
    carried_tokens: int | None = None

    def carried(self) -> tuple[str, str]:
        """``(text, reasoning)`` as the continuation's prompt carries them: without the
        healed tail."""
        cut = len(self.heal)
        if not cut:
            return self.text, self.reasoning
        if self.heal_field == "content":
            return self.text[:-cut], self.reasoning
        return self.text, self.reasoning[:-cut]


class StreamCodec:
    """Per-stream state of one protocol: rewrites each engine event for the client and keeps
    the usage (``usage``), the failure (``error``) and, where the protocol has one, the final
    response object (``final``, as sent to the client)."""

    __slots__ = ("error", "final", "usage")

    def __init__(self) -> None:
        self.usage: Usage | None = None
        self.error: GatewayError | None = None
        self.final: dict[str, Any] | None = None

    def event(self, ev: SSEEvent) -> tuple[int, bytes]:
        """``(verdict, bytes for the client)`` for one engine event that has data."""
        raise NotImplementedError

    def error_event(self, err: GatewayError) -> bytes:
        """The in-band error event of this protocol for ``err`` (after the first byte)."""
        raise NotImplementedError

    def continuation(self, point: ResumePoint, carried: list[int]) -> StreamCodec:
        """A codec for a continuation's events that splices them into this stream (the
        client keeps this stream's ids, sees no second opening event and one usage report:
        ``carried`` holds the estimated output tokens of each broken attempt, oldest first,
        summed into it). Only for protocols whose ``resume_point`` can return no blocker."""
        raise NotImplementedError

    def resume_blocker(self, point: ResumePoint) -> str | None:
        """Why this stream cannot be continued at ``point`` as far as the framing events this
        codec relayed say (those are not in ``relayed``: Messages' block starts and stops,
        ``message_delta``); None (the default): nothing against it."""
        return None

    def finished(self) -> bool:
        """True when the engine's finish came through this codec although the protocol's
        ``resume_point`` cannot tell from ``relayed`` (a continuation's chat finish reason,
        ``TextSplice``): a break then lost only the usage and end marker, and ``ending`` ends
        the stream. False (the default)."""
        return False

    def ending(self, usage: Usage | None, relayed: list[bytes]) -> bytes | None:
        """The events that end this stream for the client after the engine broke it once
        every choice had finished (``ResumePoint.complete``; ``relayed``: the engine payloads
        sent, whose ids the report takes): the usage report with ``usage``
        (the engine's if it came, else the gateway's estimate) where the client asked for one
        and none was relayed yet, then the protocol's end marker. None (the default): this
        protocol's stream is not ended on the engine's behalf (it ends with an error event)."""
        return None


class Running:
    """A request in flight (``Protocol.running``): ``replica`` is the base URL of the replica
    serving it, once known. Protocols that can cancel a request extend it."""

    __slots__ = ("replica",)

    def __init__(self) -> None:
        self.replica: str | None = None


class Protocol:
    """One client API. Subclasses set the class attributes and implement the methods that
    raise ``NotImplementedError``; the hooks default to no-ops."""

    name: ClassVar[str]  # short name: chat | completion | responses | messages | count_tokens
    path: ClassVar[str]  # the client-facing path, also the engine's path
    upstream_path: ClassVar[str | None] = None  # the engine's path when it differs from path
    #: the engine's path of a mid-stream continuation (``continuation_body``) when it differs
    #: from ``upstream_path``/``path`` (Messages: vLLM continues a prefill on chat only)
    continuation_path: ClassVar[str | None] = None
    operation: ClassVar[str]  # gen_ai.operation.name (OpenTelemetry GenAI conventions)
    count_kind: ClassVar[str] = "chat"  # how ``view`` is counted: chat | completion
    #: the body field holding the prompt, named by a refusal of its length
    #: (``context_length_exceeded``): ``messages`` | ``prompt`` | ``input``
    prompt_field: ClassVar[str] = "messages"
    #: the body field holding the output cap, named when prompt + cap is what does not fit:
    #: ``max_tokens`` (chat's ``max_completion_tokens`` when the body sets that) |
    #: ``max_output_tokens``
    output_field: ClassVar[str] = "max_tokens"
    #: True: a request whose prompt fits but prompt + output cap does not may be sent without
    #: its cap (``plan.kv_fit``, ``output_cap_overflow: lower``); False: refused (Messages)
    lowers_output_cap: ClassVar[bool] = False
    generates: ClassVar[bool] = True  # False: no output, no usage (token counting)
    default_tier_only: ClassVar[bool] = False  # True: tier hints ignored, default pool
    #: the stream keep-alive in this API's own form (an SSE comment, WHATWG "Server-sent
    #: events": ignored by every SSE parser); Messages overrides it with ``event: ping``
    keepalive: ClassVar[bytes] = b": keepalive\n\n"
    errors: ErrorShape

    def is_ping(self, ev: SSEEvent) -> bool:
        """True for a data event of the engine that only keeps the stream alive (Messages'
        ``ping``); SSE comments are pings in every API."""
        return False

    def span_attributes(self) -> dict[str, str]:
        """Extra attributes of the request span (e.g. ``openai.api.type``)."""
        return {}

    def parse(self, raw: bytes) -> ParsedBody:
        """Parse and leniently validate a request body; ``InvalidRequest`` (400) otherwise."""
        raise NotImplementedError

    def service_tier(self, doc: dict[str, Any]) -> object:
        """The body's tier hint in OpenAI's ``service_tier`` vocabulary (None: absent)."""
        return None

    async def prepare(self, body: ParsedBody, key_id: str | None) -> None:
        """Work before routing (e.g. expand ``previous_response_id``); may raise."""

    @contextlib.asynccontextmanager
    async def running(self, body: ParsedBody, rec: RequestRecord) -> AsyncIterator[Running]:
        """Context around the attempt and the relay of one request."""
        yield Running()

    def upstream_body(
        self, body: ParsedBody, served_model: str, priority: int | None = None
    ) -> bytes:
        """The bytes sent to the engine (``model`` rewritten, owned fields set). ``priority``:
        vLLM's scheduling priority for engines running ``--scheduling-policy priority``
        (admission's band; ``gateway.admit``); protocols whose vLLM endpoint takes no
        ``priority`` field ignore it (the gateway queue still orders them)."""
        raise NotImplementedError

    def head_kind(self, ev: SSEEvent) -> tuple[int, GatewayError | None]:
        """Classify an event read before the first content event: ``(HEAD_*, error)``; the
        error is set for ``HEAD_ERROR``."""
        raise NotImplementedError

    def codec(self, body: ParsedBody, rewrite: Rewrite) -> StreamCodec:
        """A codec for one stream of this protocol."""
        raise NotImplementedError

    def json_usage(self, doc: dict[str, Any]) -> Usage | None:
        """Usage of a JSON answer (None when absent or malformed)."""
        raise NotImplementedError

    def rewrite_json(self, doc: dict[str, Any], body: ParsedBody, rewrite: Rewrite) -> bytes:
        """A JSON answer rewritten for the client and serialised (``doc`` is updated too)."""
        raise NotImplementedError

    async def finish(
        self, body: ParsedBody, key_id: str | None, final: dict[str, Any] | None
    ) -> None:
        """For a successful answer, before its last bytes are sent: ``final`` is the response
        object the client is sent. Must not raise (the answer is already decided)."""

    def output_text(self, relayed: list[bytes]) -> str:
        """Generated text of the relayed content events (for a usage estimate)."""
        return ""

    def json_output_text(self, doc: dict[str, Any]) -> str:
        """Generated text of a JSON answer (for a usage estimate)."""
        return ""

    def error_event(self, err: GatewayError) -> bytes:
        """The in-band error event when no codec exists yet (stream started elsewhere)."""
        return self.errors.event(err, 0)


@typing.runtime_checkable
class Resumable(typing.Protocol):
    """The optional resume capability of a ``Protocol``: a stream of this API broken after
    content reached the client can be continued by another request (the OpenAI APIs,
    Responses, Messages). An API without it is never continued (``resume_point`` below)."""

    def resume_point(self, body: ParsedBody, relayed: list[bytes]) -> ResumePoint:
        """What the client got of a stream that broke (``relayed``: the raw content payloads
        sent, every attempt's), read only after the break, so an unbroken stream pays
        nothing."""
        ...

    def continuation_body(
        self, body: ParsedBody, served_model: str, point: ResumePoint,
        priority: int | None = None,
    ) -> bytes:
        """The upstream body that asks an engine to continue ``point``'s output (a stream,
        with usage); only called for a point without a blocker."""
        ...


@typing.runtime_checkable
class Assembling(typing.Protocol):
    """The optional assembly capability of a ``Protocol``: a JSON answer built from an upstream
    stream (``body.assemble``; the OpenAI chat and completions APIs)."""

    def assembler(self, body: ParsedBody, rewrite: Rewrite) -> StreamCodec | None:
        """The codec the upstream stream's events pass through (nothing reaches the client
        until ``assemble``). None: this request's JSON answer comes from the engine's own
        JSON body."""
        ...

    def assemble(self, relayed: list[bytes], usage: Usage | None) -> dict[str, Any]:
        """The JSON answer the engine would have sent, from the raw payloads of its stream
        (``relayed``; ``usage``: a resumed stream's summed usage, else None)."""
        ...


def resume_point(protocol: Protocol, body: ParsedBody, relayed: list[bytes]) -> ResumePoint:
    """``protocol``'s resume point of a broken stream; blocker ``protocol`` for an API without
    the resume capability (``Resumable``)."""
    if isinstance(protocol, Resumable):
        return protocol.resume_point(body, relayed)
    return ResumePoint(blocker="protocol")


def assembler(protocol: Protocol, body: ParsedBody, rewrite: Rewrite) -> StreamCodec | None:
    """``protocol``'s assembly codec for ``body`` (``Assembling``); None for an API that does
    not assemble JSON answers from streams."""
    return protocol.assembler(body, rewrite) if isinstance(protocol, Assembling) else None
