"""The part the splices of a chat-completions continuation into a typed-event stream share
(``TextSplice``: Messages' ``MessagesSplice``, Responses' ``ResponsesSplice``): read each chat
chunk of the continuation, sum the usage over the attempts, drop the healed tail the client
already has (token healing, ``openai.resume.heal_tail``), note the finish, and hand each new
piece of text to the protocol's own event (``text_event``) and the end to its own ending
(``ending_events``)."""

from __future__ import annotations

from typing import Any, ClassVar

import orjson

from gateway.common.sse import SSEEvent
from gateway.common.usage import Usage
from gateway.errors import GatewayError, UpstreamError, stream_error
from gateway.protocols.base import CONTENT, DONE, ERROR, SKIP, ResumePoint, StreamCodec
from gateway.protocols.openai.splice import delta_reasoning, summed_usage
from gateway.telemetry.tokencount import count_text


def chat_continuation(
    out: dict[str, Any], served_model: str, messages: list[dict[str, Any]],
    point: ResumePoint,
) -> int:
    """Fill ``out`` (the client's carried fields) as the chat-completions request that
    continues ``point``'s cut text: ``messages`` (the conversation in chat's words) plus an
    assistant message with the carried text (the reasoning before it as ``reasoning``, which
    vLLM's chat templates read), continued in place (``continue_final_message``), streamed
    with usage. Returns the output tokens already produced (the engine's count of the carried
    text when it said, else the estimate: the healed tail is generated again), for the
    caller's output cap."""
    text, reasoning = point.carried()
    produced = point.carried_tokens
    if produced is None:
        produced = point.tokens - count_text(point.heal)
    prefix: dict[str, Any] = {"role": "assistant", "content": text}
    if reasoning:
        prefix["reasoning"] = reasoning
    out.update(model=served_model, messages=[*messages, prefix], stream=True,
               stream_options={"include_usage": True}, continue_final_message=True,
               add_generation_prompt=False)
    return produced


class TextSplice(StreamCodec):
    """Codec of a chat-completions continuation of one cut text (``point``): ``carried``
    holds the estimated output tokens of each broken attempt (``summed_usage``), ``pending``
    the healed tail still expected at the start of the output (``diverged`` once the output
    starts otherwise: an error, and the relay continues again carrying the whole text),
    ``finish`` the continuation's ``(finish_reason, stop_reason)`` (vLLM's matched stop
    string, else None) once it came. A tool call or reasoning in the continuation is an error
    event (the cut part is text; no exact splice exists). Subclasses write the events:
    ``text_event`` and ``ending_events``; ``cut`` names the cut part in that error."""

    __slots__ = ("carried", "diverged", "finish", "pending")
    cut: ClassVar[str] = "text"

    def __init__(self, point: ResumePoint, carried: list[int]) -> None:
        super().__init__()
        self.carried = list(carried)
        self.pending = point.heal
        self.diverged = False
        self.finish: tuple[str, str | None] | None = None

    def text_event(self, text: str, ev: SSEEvent) -> bytes:
        """The client's event(s) for ``text``, new output; ``ev.data`` is replaced by the
        payload sent, so ``relayed`` holds this protocol's events only (a later break is read
        as the first one)."""
        raise NotImplementedError

    def ending_events(self) -> bytes:
        """The events that end the client's stream once the continuation finished."""
        raise NotImplementedError

    def finished(self) -> bool:
        """True once the continuation's finish reason came (its usage and end may be lost)."""
        return self.finish is not None

    def ending(self, usage: Usage | None, relayed: list[bytes]) -> bytes | None:
        """``ending_events`` for a continuation that broke after its finish reason (only its
        usage and end marker lost; ``usage``: the engine's if it came, else the gateway's
        estimate of the whole request); None before its finish."""
        if self.finish is None:
            return None
        if self.usage is None:
            self.usage = usage
        return self.ending_events()

    def _fail(self, err: GatewayError) -> tuple[int, bytes]:
        self.error = err
        return ERROR, self.error_event(err)

    def event(self, ev: SSEEvent) -> tuple[int, bytes]:
        if ev.is_done:
            return DONE, self.ending_events()
        try:
            doc = orjson.loads(ev.data or b"")
        except orjson.JSONDecodeError:
            doc = None
        if not isinstance(doc, dict):
            return self._fail(UpstreamError("engine sent a malformed event mid-stream"))
        choices = doc.get("choices")
        if "error" in doc and not choices:
            return self._fail(stream_error(doc))
        if isinstance(doc.get("usage"), dict):
            last = Usage.from_openai(doc["usage"])
            if last is not None:
                self.usage = summed_usage(last, self.carried)
        if not isinstance(choices, list) or not choices:
            if self.finish is not None and self.usage:
                return DONE, self.ending_events()
            return SKIP, b""
        c = choices[0] if isinstance(choices[0], dict) else {}
        d = c.get("delta")
        delta: dict[str, Any] = d if isinstance(d, dict) else {}
        if delta.get("tool_calls") or delta_reasoning(delta):
            return self._fail(UpstreamError(
                f"the continuation of a {self.cut} produced a tool call or reasoning"))
        text = delta.get("content") if isinstance(delta.get("content"), str) else ""
        if self.pending and text:
            n = min(len(self.pending), len(text))
            if text[:n] != self.pending[:n]:
                self.diverged = True
                return self._fail(UpstreamError(
                    "the continuation's output diverged from the text already relayed"))
            self.pending, text = self.pending[n:], text[n:]
        if c.get("finish_reason") is not None:
            matched = c.get("stop_reason")
            self.finish = (str(c["finish_reason"]), matched if isinstance(matched, str) else None)
        if not text:
            return SKIP, b""
        return CONTENT, self.text_event(text, ev)
