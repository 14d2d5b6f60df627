"""Mid-stream resume for Responses streams (``POST /v1/responses`` with ``stream: true``): what
the client already got (``resume_point``), what the codec saw of the stream's framing
(``Framing``), the continuation request (``continuation_body``) and the codec that splices its
output into the client's stream (``ResponsesSplice``).

vLLM's ``/v1/responses`` cannot continue a partial assistant turn (it renders the input as a
chat with a generation prompt and has no ``continue_final_message``), so, as for Messages
(``messages.resume``), the continuation goes to the same engine's ``/v1/chat/completions`` with
the input converted the way vLLM's Responses serving converts it (``instructions`` as the
system message, message items by role (an ``input_image`` part as chat's ``image_url``),
``function_call`` / ``function_call_output`` items as tool calls and results, ``reasoning``
items left out, function tools as chat tools; the simulator's
``engines/sim/responses_api.to_chat`` follows it) plus the partial assistant text,
``continue_final_message: true`` and ``add_generation_prompt: false``. Its chunks become the
client's Responses events: ``response.output_text.delta`` on the cut message item (its
``item_id``, ``output_index`` and ``content_index``), ``sequence_number`` continuing the
stream's, then one ``response.output_text.done``, ``response.content_part.done``,
``response.output_item.done`` and ``response.completed`` whose response object (the one
``response.created`` opened, ids kept) holds every output item and usage summed over the
attempts (``summed_usage``).

Resumable: the break came inside the text of a message item (a reasoning item before it is
carried as the continuation's ``reasoning``). Blockers: ``tool-call`` (a function or custom
tool call had started: its partial arguments cannot be continued exactly), ``thinking`` (the
break cut a reasoning item: its content and ``encrypted_content`` are the engine's),
``protocol`` (a refusal, or text in two message items), ``structured-output`` (``text.format``
``json_schema``/``json_object``: the engine's grammar would start again), ``finished``
(the cut item's ``output_text.done`` or the terminal event was relayed), ``block-closed``
(the message item was closed for the client).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.common.sse import SSEEvent
from gateway.common.usage import Usage
from gateway.errors import GatewayError
from gateway.protocols.base import ResumePoint, StreamCodec, named_event
from gateway.protocols.body import ParsedBody
from gateway.protocols.error_shapes import RESPONSES_ERRORS
from gateway.protocols.openai.resume import heal_tail
from gateway.protocols.splice.text_splice import TextSplice, chat_continuation
from gateway.telemetry.tokencount import count_text

#: the engine's chat path the continuation is sent to (module docstring)
CONTINUATION_PATH = "/v1/chat/completions"
# Responses fields the conversion consumes or that chat has no place for; every other field
# of the client's body (sampling, vLLM's extensions) is carried as is
_CONVERTED = frozenset({
    "model", "input", "instructions", "tools", "tool_choice", "max_output_tokens", "stream",
    "store", "request_id", "previous_response_id", "include", "text", "reasoning", "truncation",
    "metadata", "user", "service_tier", "background", "max_tool_calls", "prompt",
    "prompt_cache_key", "prompt_cache_retention", "safety_identifier", "top_logprobs",
    "stream_options", "conversation",
})
_TOOL_DELTAS = frozenset({"response.function_call_arguments.delta",
                          "response.custom_tool_call_input.delta"})
_REASONING_DELTAS = frozenset({"response.reasoning_text.delta",
                               "response.reasoning_summary_text.delta"})


@dataclass(slots=True)
class Framing:
    """What a Responses codec saw of the framing events it relayed (they are not in
    ``relayed``): ``response`` the object of ``response.created`` as sent (rewritten),
    ``items`` the output items done so far, ``open`` the message item open for the client
    (its ``output_item.added`` item with ``output_index``, ``content_index`` set by
    ``content_part.added``), ``text_done`` (its ``output_text.done`` was relayed), ``ended``
    (a terminal event was), ``seq`` the last ``sequence_number`` sent."""

    response: dict[str, Any] | None = None
    items: list[dict[str, Any]] = field(default_factory=list)
    open: dict[str, Any] | None = None
    text_done: bool = False
    ended: bool = False
    seq: int = -1

    def observe(self, kind: object, doc: dict[str, Any]) -> None:
        """Take one relayed event (``kind``: its ``type``; ``doc``: as sent)."""
        seq = doc.get("sequence_number")
        if type(seq) is int:
            self.seq = seq
        if kind == "response.created" and isinstance(doc.get("response"), dict):
            self.response = doc["response"]  # parsed for this event alone: kept as is
        elif kind == "response.output_item.added":
            item = doc.get("item")
            if isinstance(item, dict) and item.get("type") == "message":
                self.open = {"item": item, "output_index": doc.get("output_index", 0),
                             "content_index": 0}
                self.text_done = False
            else:
                self.open = None
        elif kind == "response.content_part.added" and self.open is not None:
            index = doc.get("content_index")
            self.open["content_index"] = index if type(index) is int else 0
        elif kind == "response.output_text.done":
            self.text_done = True
        elif kind == "response.output_item.done":
            if isinstance(doc.get("item"), dict):
                self.items.append(doc["item"])
            self.open = None
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            self.ended = True

    def blocker(self, point: ResumePoint) -> str | None:
        """``finished`` once the cut item's text or the response was ended for the client;
        ``block-closed`` unless the message item ``point.id`` is still open for it."""
        if self.ended or self.text_done:
            return "finished"
        if self.open is None or self.open["item"].get("id") != point.id:
            return "block-closed"
        return None


def resume_point(body: ParsedBody, relayed: list[bytes]) -> ResumePoint:
    """What the client got of a broken Responses stream (``relayed``: its content payloads:
    deltas and non-message, non-reasoning ``output_item.added``): ``text`` of the message item
    the break cut (``id``: its ``item_id``), ``reasoning`` the reasoning text before it, and
    the blocker (module docstring; the framing's, ``Framing.blocker``, is the codec's)."""
    point = ResumePoint()
    last_kind = ""
    text_items: list[str] = []
    text: list[str] = []
    reasoning: list[str] = []
    for data in relayed:
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(doc, dict):
            continue
        kind = doc.get("type")
        delta = doc.get("delta")
        if kind == "response.output_text.delta" and isinstance(delta, str):
            item = doc.get("item_id")
            if not text_items or text_items[-1] != item:
                text_items.append(item if isinstance(item, str) else "")
            text.append(delta)
            last_kind = "text"
        elif kind in _REASONING_DELTAS:
            if isinstance(delta, str):
                reasoning.append(delta)
            last_kind = "reasoning"
        elif kind in _TOOL_DELTAS or kind == "response.output_item.added":
            point.blocker, last_kind = point.blocker or "tool-call", "tool"
        elif kind == "response.refusal.delta":
            point.blocker, last_kind = point.blocker or "protocol", "refusal"
    fmt = body.doc.get("text")
    fmt = fmt.get("format") if isinstance(fmt, dict) else None
    if isinstance(fmt, dict) and fmt.get("type") not in (None, "text"):
        point.blocker = "structured-output"  # vLLM's grammar would restart (openai_resume)
    if point.blocker is None:
        if last_kind != "text":
            point.blocker = "thinking" if last_kind == "reasoning" else "protocol"
        elif len(text_items) > 1:
            point.blocker = "protocol"  # text in two items: no single text to continue
    point.text = "".join(text)
    point.reasoning = "".join(reasoning)
    point.id = text_items[-1] if text_items else None
    point.tokens = count_text(point.text) + count_text(point.reasoning)
    if point.text:
        point.heal = heal_tail(point.text)
    return point


def chat_messages(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The Responses input as vLLM's Responses serving renders it as a chat (module
    docstring): ``instructions`` first, then one message per item; ``reasoning`` items and
    items of other types left out."""
    out: list[dict[str, Any]] = []
    if isinstance(doc.get("instructions"), str) and doc["instructions"]:
        out.append({"role": "system", "content": doc["instructions"]})
    value = doc.get("input")
    items = [{"role": "user", "content": value}] if isinstance(value, str) else value or ()
    for item in items:
        kind = item.get("type") or "message"
        if kind == "message":
            out.append({"role": item.get("role", "user"),
                        "content": _content(item.get("content"))})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments")}}
            out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            out.append({"role": "tool", "tool_call_id": item.get("call_id"),
                        "content": output if isinstance(output, str) else _text(output)})
    return out


def continuation_body(
    body: ParsedBody, served_model: str, point: ResumePoint, priority: int | None = None,
    full_input: list[Any] | None = None,
) -> bytes:
    """The chat-completions request continuing ``point`` (module docstring): the converted
    input (``full_input``: the input with ``previous_response_id`` expanded, when it was) plus
    an assistant message with the carried text (the reasoning before it as ``reasoning``),
    ``max_tokens`` the ``max_output_tokens`` left after the carried tokens (the engine's count
    when known, else the estimate; at least 1; absent when the client set none), function
    tools as chat tools, ``tool_choice`` and ``reasoning.effort`` converted, the client's other
    fields carried, stream with usage. ``priority``: vLLM's field, as for the first attempt."""
    doc = body.doc if full_input is None else {**body.doc, "input": full_input}
    out: dict[str, Any] = {k: v for k, v in doc.items() if k not in _CONVERTED}
    produced = chat_continuation(out, served_model, chat_messages(doc), point)
    if type(doc.get("max_output_tokens")) is int:
        out["max_tokens"] = max(1, doc["max_output_tokens"] - produced)
    tools = [{"type": "function", "function": {
        "name": t.get("name"), "description": t.get("description"),
        "parameters": t.get("parameters") or {}}}
        for t in doc.get("tools") or () if isinstance(t, dict) and t.get("type") == "function"]
    if tools:
        out["tools"] = tools
        out["tool_choice"] = _tool_choice(doc.get("tool_choice"))
    effort = doc.get("reasoning")
    if isinstance(effort, dict) and isinstance(effort.get("effort"), str):
        out["reasoning_effort"] = effort["effort"]
    if priority is not None:
        out["priority"] = int(priority)
    return orjson.dumps(out)


class ResponsesSplice(TextSplice):
    """Codec of a chat-completions continuation spliced into a Responses stream (module
    docstring; ``TextSplice``): each new piece of ``delta.content`` becomes a
    ``response.output_text.delta`` on the cut item, numbered after ``framing.seq``; the finish
    ends the item and the response (``ending_events``; ``final`` is that response object, also
    set on ``root``, the stream's first codec, whose ``final`` the handler stores)."""

    __slots__ = ("framing", "root", "text")
    cut = "message"

    def __init__(self, root: StreamCodec, framing: Framing, point: ResumePoint,
                 carried: list[int]) -> None:
        super().__init__(point, carried)
        self.root, self.framing = root, framing
        self.text = point.text  # the cut item's whole text as the client has it

    def continuation(self, point: ResumePoint, carried: list[int]) -> StreamCodec:
        return ResponsesSplice(self.root, self.framing, point, carried)

    def resume_blocker(self, point: ResumePoint) -> str | None:
        return self.framing.blocker(point)

    def error_event(self, err: GatewayError) -> bytes:
        return RESPONSES_ERRORS.event(err, self.framing.seq + 1)

    def _event(self, kind: str, fields: dict[str, Any]) -> tuple[bytes, bytes]:
        """``(payload, SSE event)`` of one event numbered next."""
        self.framing.seq += 1
        data = orjson.dumps({"type": kind, "sequence_number": self.framing.seq, **fields})
        return data, named_event(kind, data)

    def text_event(self, text: str, ev: SSEEvent) -> bytes:
        self.text += text
        data, event = self._event("response.output_text.delta", {
            **self._at(), "delta": text, "logprobs": []})
        ev.data = data  # what the client gets: ``relayed`` keeps it (a later resume reads it)
        return event

    def _at(self) -> dict[str, Any]:
        """The cut part's address: ``item_id``, ``output_index``, ``content_index``."""
        opened = self.framing.open or {"item": {}, "output_index": 0, "content_index": 0}
        return {"item_id": opened["item"].get("id"), "output_index": opened["output_index"],
                "content_index": opened["content_index"]}

    def ending_events(self) -> bytes:
        """``output_text.done``, ``content_part.done``, ``output_item.done`` and
        ``response.completed`` for the client; sets ``final`` (here and on ``root``)."""
        at = self._at()
        opened = self.framing.open or {"item": {}}
        part = {"annotations": [], "text": self.text, "type": "output_text", "logprobs": []}
        item = {**opened["item"], "content": [part], "status": "completed"}
        item.setdefault("role", "assistant")
        item.setdefault("type", "message")
        out = [self._event("response.output_text.done",
                           {**at, "text": self.text, "logprobs": []})[1],
               self._event("response.content_part.done", {**at, "part": part})[1],
               self._event("response.output_item.done",
                           {"output_index": at["output_index"], "item": item})[1]]
        self.framing.items.append(item)
        self.framing.open = None
        resp = dict(self.framing.response or {"object": "response"})
        incomplete = self.finish is not None and self.finish[0] == "length"
        resp.update(output=list(self.framing.items),
                    status="incomplete" if incomplete else "completed",
                    incomplete_details={"reason": "max_output_tokens"} if incomplete else None)
        if self.usage is not None:
            resp["usage"] = usage_object(self.usage)
        self.final = self.root.final = resp
        self.framing.ended = True
        out.append(self._event("response.completed", {"response": resp})[1])
        return b"".join(out)


def usage_object(u: Usage) -> dict[str, Any]:
    """A Responses ``usage`` object of ``u`` (``input_tokens`` includes the cached ones; no
    reasoning count is known for a resumed response: 0)."""
    return {"input_tokens": u.prompt, "input_tokens_details": {"cached_tokens": u.cached},
            "output_tokens": u.completion, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u.prompt + u.completion}


def _tool_choice(choice: Any) -> str | dict[str, Any]:
    """A Responses ``tool_choice`` in chat's words: ``auto``/``none``/``required`` as is, a
    function (``{"type": "function", "name"}``) as chat's ``{"type": "function", "function":
    {"name"}}``; anything else (hosted tools, ``allowed_tools``) ``auto``."""
    if choice in ("auto", "none", "required"):
        return str(choice)
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return "auto"


def _content(content: Any) -> str | list[dict[str, Any]]:
    """A message item's content for chat: its text (``_text``), or, when it holds an image,
    chat's parts (text parts as ``text``, ``input_image`` as ``image_url``, as vLLM's chat
    parser reads them; any other part carried as is for the engine to judge), so an image
    the model saw is not silently left out of the continuation's conversation."""
    if not isinstance(content, list) or not any(
            isinstance(p, dict) and p.get("type") == "input_image" for p in content):
        return _text(content)
    parts: list[dict[str, Any]] = []
    for p in content:
        if not isinstance(p, dict):
            continue
        if isinstance(p.get("text"), str):
            parts.append({"type": "text", "text": p["text"]})
        elif p.get("type") == "input_image" and isinstance(p.get("image_url"), str):
            image: dict[str, Any] = {"url": p["image_url"]}
            if isinstance(p.get("detail"), str):
                image["detail"] = p["detail"]
            parts.append({"type": "image_url", "image_url": image})
        else:
            parts.append(p)
    return parts


def _text(content: Any) -> str:
    """The text of a string or of the parts (with ``text``) of a part list, joined by lines."""
    if isinstance(content, str):
        return content
    return "\n".join(p["text"] for p in content if isinstance(p, dict)
                     and isinstance(p.get("text"), str)) if isinstance(content, list) else ""
