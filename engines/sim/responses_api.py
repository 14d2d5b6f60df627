"""``POST /v1/responses`` as vLLM 0.32 serves it (no store: ``VLLM_ENABLE_RESPONSES_API_STORE``
unset, its default).

Shapes from vLLM 0.32 ``entrypoints/openai/responses/`` (``serving.py``, ``protocol.py``,
``streaming_events.py``, the non-Harmony "simple" path):

- the request is rendered as a chat (``instructions`` as the system message, message items by
  role, ``function_call`` / ``function_call_output`` items as tool calls and results, function
  tools as chat tools; ``reasoning`` items accepted and not rendered; an item of any other
  type is 400 ``input.<i>.type``); the response id is the body's ``request_id`` (vLLM's
  extra field) or ``resp_`` + 16 hex; ``store`` is silently treated as false;
  ``previous_response_id`` is 404 (``Response with id '<id>' not found.``) as nothing is
  stored; ``background`` with ``store`` is 400;
- ``reasoning`` asks for reasoning (a ``reasoning`` item first: ``reasoning_part.added``,
  ``reasoning_text.delta``/``.done``, ``reasoning_part.done``; ``encrypted_content`` set when
  ``include`` has ``reasoning.encrypted_content``); ``text.format`` ``json_schema`` /
  ``json_object`` is the chat ``response_format``;
- stream: ``event: <type>`` + ``data: {json}`` per event, ``sequence_number`` from 0:
  ``response.created``, ``response.in_progress``, then per output item ``output_item.added``
  (+ ``content_part.added`` for a message), its deltas (``output_text.delta``,
  ``function_call_arguments.delta``), its done events, and ``response.completed`` (also for an
  ``incomplete`` response) with the full response object; no ``[DONE]``;
- JSON: the full response object (every field, ``null`` included), ``status`` ``completed`` or
  ``incomplete`` (``incomplete_details.reason`` = ``max_output_tokens``);
- usage: ``input_tokens`` (cached included), ``input_tokens_details`` (``cached_tokens``, always
  reported, ``cache_write_tokens`` 0, per-turn lists), ``output_tokens``,
  ``output_tokens_details``, ``total_tokens``.

Content events counted by the faults: text deltas, the function-call item (it names the tool),
argument deltas.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
from aiohttp import web

from engines.sim import protocol as P
from engines.sim.request import RequestContext, RequestError
from engines.sim.responder import (
    Event,
    collect,
    reasoning_signature,
    respond_typed_stream,
)

Deliveries = AsyncIterator[list[tuple[int, int, bool]]]


#: Input item types rendered (``reasoning`` items are accepted and left out of the prompt);
#: any other type is a 400 naming ``input.<i>.type``, as vLLM's pydantic union refuses it.
_INPUT_ITEM_TYPES = frozenset({  # OpenAI's input item types (openai 3.57), as vLLM's union
    "message", "function_call", "function_call_output", "reasoning", "item_reference",
    "custom_tool_call", "custom_tool_call_output", "local_shell_call", "local_shell_call_output",
    "shell_call", "shell_call_output", "apply_patch_call", "apply_patch_call_output",
    "computer_call", "computer_call_output", "file_search_call", "web_search_call",
    "image_generation_call", "code_interpreter_call", "mcp_call", "mcp_list_tools",
    "mcp_approval_request", "mcp_approval_response", "tool_search_call", "tool_search_output",
    "compaction", "compaction_trigger", "additional_tools", "configuration_update", "program",
    "program_output",
})


def response_id(body: dict[str, Any]) -> str:
    """The response id: the body's ``request_id`` or ``resp_`` + 16 hex (vLLM's default)."""
    rid = body.get("request_id")
    return rid if isinstance(rid, str) and rid else P.random_id("resp_")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(
        p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
    ) if isinstance(content, list) else ""


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The request in chat-completions form; raises ``RequestError`` like vLLM 0.32."""
    prev = body.get("previous_response_id")
    if prev is not None:
        raise RequestError(404, f"Response with id '{prev}' not found.", "response_id")
    if body.get("background") and body.get("store", True):
        raise RequestError(
            400, "This vLLM engine does not support `store=True` and therefore does not "
            "support the background mode. To enable these features, set the environment "
            "variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server.",
            "background",
        )
    value = body.get("input")
    if isinstance(value, str):
        value = [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise RequestError(400, "input: Field required", "input")
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str):
        messages.append({"role": "system", "content": body["instructions"]})
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise RequestError(400, "input: each item must be an object", "input")
        kind = item.get("type") or "message"
        if kind not in _INPUT_ITEM_TYPES:
            raise RequestError(400, f"input.{i}.type: unknown input item type {kind!r}",
                               f"input.{i}.type")
        if kind == "function_call":
            fn = {"name": item.get("name"), "arguments": item.get("arguments")}
            call = {"id": item.get("call_id"), "type": "function", "function": fn}
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                             "content": output if isinstance(output, str) else str(output)})
        elif kind == "message":
            text = _text(item.get("content"))
            messages.append({"role": item.get("role", "user"), "content": text})
    tools = [
        {"type": "function", "function": {"name": t.get("name"),
                                          "parameters": t.get("parameters") or {}}}
        for t in body.get("tools") or () if isinstance(t, dict) and t.get("type") == "function"
    ]
    choice = body.get("tool_choice", "auto")
    if isinstance(choice, dict) and choice.get("type") == "function":
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    reasoning = body.get("reasoning")
    effort = reasoning.get("effort") or "medium" if isinstance(reasoning, dict) else None
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    response_format: dict[str, Any] | None = None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        response_format = {"type": "json_schema", "json_schema": {
            "name": fmt.get("name"), "schema": fmt.get("schema"), "strict": fmt.get("strict")}}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        response_format = {"type": "json_object"}
    return {"model": body.get("model"), "messages": messages, "tools": tools or None,
            "tool_choice": choice, "max_tokens": body.get("max_output_tokens"),
            "reasoning_effort": effort, "response_format": response_format}


def encrypted(ctx: RequestContext) -> bool:
    """True when the request's ``include`` asks for ``reasoning.encrypted_content``."""
    include = ctx.body.get("include")
    return isinstance(include, list) and "reasoning.encrypted_content" in include


def reasoning_item(item_id: str, text: str, status: str | None,
                   encrypted_content: str | None) -> dict[str, Any]:
    """A ``reasoning`` output item (vLLM: the reasoning parser's text as one
    ``reasoning_text`` content part, no summary)."""
    return {"id": item_id, "summary": [], "type": "reasoning",
            "content": [{"text": text, "type": "reasoning_text"}] if text else [],
            "encrypted_content": encrypted_content, "status": status}


class _Builder:
    """Events of one streamed response, numbered, and its output items."""

    def __init__(self, ctx: RequestContext) -> None:
        self.ctx = ctx
        self.seq = 0
        self.index = -1  # output_index of the open item
        self.open: str | None = None  # "reasoning" | "message" | "function_call"
        self.item_id = ""
        self.call_id = ""
        self.name = ""
        self.acc = ""
        self.output: list[dict[str, Any]] = []

    def _ev(self, kind: str, doc: dict[str, Any], content: bool = False) -> Event:
        doc = {"type": kind, "sequence_number": self.seq, **doc}
        self.seq += 1
        return kind.encode(), orjson.dumps(doc), content

    def created(self) -> list[Event]:
        obj = response_object(self.ctx, "in_progress", [], None)
        return [self._ev("response.created", {"response": obj}),
                self._ev("response.in_progress", {"response": obj})]

    def delta(self, kind: str, text: str) -> list[Event]:
        events: list[Event] = []
        if kind == "r":
            if not text:
                return events
            if self.open != "reasoning":
                events += self.close()
                self.index, self.open, self.acc = self.index + 1, "reasoning", ""
                self.item_id = P.random_id("rs_")
                item = reasoning_item(self.item_id, "", "in_progress", None)
                events.append(self._ev("response.output_item.added",
                                       {"output_index": self.index, "item": item}))
                events.append(self._ev("response.reasoning_part.added", {
                    "output_index": self.index, "item_id": self.item_id, "content_index": 0,
                    "part": {"text": "", "type": "reasoning_text"}}))
            self.acc += text
            events.append(self._ev("response.reasoning_text.delta", {
                "content_index": 0, "delta": text, "item_id": self.item_id,
                "output_index": self.index}, True))
        elif kind == "c":
            if not text:
                return events
            if self.open != "message":
                events += self.close()
                self.index, self.open, self.acc = self.index + 1, "message", ""
                self.item_id = P.random_id("msg_")
                item = {"id": self.item_id, "content": [], "role": "assistant",
                        "status": "in_progress", "type": "message"}
                events.append(self._ev("response.output_item.added",
                                       {"output_index": self.index, "item": item}))
                part = {"annotations": [], "text": "", "type": "output_text", "logprobs": []}
                events.append(self._ev("response.content_part.added", {
                    "output_index": self.index, "item_id": self.item_id, "content_index": 0,
                    "part": part}))
            self.acc += text
            events.append(self._ev("response.output_text.delta", {
                "content_index": 0, "delta": text, "item_id": self.item_id, "logprobs": [],
                "output_index": self.index}, True))
        elif kind == "h":
            events += self.close()
            self.index, self.open, self.acc, self.name = self.index + 1, "function_call", "", text
            self.item_id, self.call_id = P.random_id("fc_"), P.random_id("chatcmpl-tool-")
            item = function_call(self.item_id, self.call_id, text, "", "in_progress")
            events.append(self._ev("response.output_item.added",
                                   {"output_index": self.index, "item": item}, True))
        elif text:
            self.acc += text
            events.append(self._ev("response.function_call_arguments.delta", {
                "output_index": self.index, "item_id": self.item_id, "delta": text}, True))
        return events

    def close(self) -> list[Event]:
        if self.open is None:
            return []
        at = {"output_index": self.index, "item_id": self.item_id}
        if self.open == "reasoning":
            part = {"text": self.acc, "type": "reasoning_text"}
            sealed = reasoning_signature(self.acc) if encrypted(self.ctx) else None
            item = reasoning_item(self.item_id, self.acc, "completed", sealed)
            events = [
                self._ev("response.reasoning_text.done",
                         {**at, "content_index": 0, "text": self.acc}),
                self._ev("response.reasoning_part.done",
                         {**at, "content_index": 0, "part": part}),
            ]
        elif self.open == "message":
            part = output_text(self.acc)
            item = message(self.item_id, self.acc)
            events = [
                self._ev("response.output_text.done",
                         {**at, "content_index": 0, "text": self.acc, "logprobs": []}),
                self._ev("response.content_part.done", {**at, "content_index": 0, "part": part}),
            ]
        else:
            item = function_call(self.item_id, self.call_id, self.name, self.acc, "completed")
            events = [self._ev("response.function_call_arguments.done",
                               {**at, "arguments": self.acc, "name": self.name})]
        events.append(self._ev("response.output_item.done",
                               {"output_index": self.index, "item": item}))
        self.output.append(item)
        self.open = None
        return events

    def completed(self) -> list[Event]:
        events = self.close()
        status = "incomplete" if self.ctx.plans[0].finish == "length" else "completed"
        obj = response_object(self.ctx, status, self.output, usage(self.ctx))
        return [*events, self._ev("response.completed", {"response": obj})]


def output_text(text: str) -> dict[str, Any]:
    """An ``output_text`` content part."""
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": None}


def message(item_id: str, text: str) -> dict[str, Any]:
    """A completed assistant message item (no content part when the text is empty)."""
    return {"id": item_id, "content": [output_text(text)] if text else [], "role": "assistant",
            "status": "completed", "type": "message"}


def function_call(item_id: str, call_id: str, name: str, args: str, status: str) -> dict[str, Any]:
    """A ``function_call`` output item."""
    return {"arguments": args, "call_id": call_id, "name": name, "type": "function_call",
            "id": item_id, "namespace": None, "status": status}


def usage(ctx: RequestContext) -> dict[str, Any]:
    """The Responses usage object (cached tokens always reported, as vLLM does)."""
    p, c, o = ctx.prompt_tokens, ctx.cached_tokens(), ctx.completion_tokens
    plan = ctx.plans[0]
    r = sum(1 for k, _ in plan.items[: plan.pos] if k == "r")
    return {
        "input_tokens": p,
        "input_tokens_details": {"cached_tokens": c, "cache_write_tokens": 0,
                                 "input_tokens_per_turn": [p], "cached_tokens_per_turn": [c]},
        "output_tokens": o,
        "output_tokens_details": {"reasoning_tokens": r, "tool_output_tokens": 0,
                                  "output_tokens_per_turn": [o],
                                  "tool_output_tokens_per_turn": [0]},
        "total_tokens": p + o,
    }


def response_object(ctx: RequestContext, status: str, output: list[dict[str, Any]],
                    usage_: dict[str, Any] | None) -> dict[str, Any]:
    """vLLM's ``ResponsesResponse.from_request`` as ``model_dump`` writes it."""
    b = ctx.body
    return {
        "id": ctx.rid, "created_at": ctx.created,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": b.get("instructions"), "metadata": b.get("metadata"), "model": ctx.model,
        "object": "response", "output": output,
        "parallel_tool_calls": b.get("parallel_tool_calls", True),
        "temperature": b.get("temperature") if b.get("temperature") is not None else 1.0,
        "tool_choice": b.get("tool_choice", "auto"), "tools": b.get("tools") or [],
        "top_p": b.get("top_p") if b.get("top_p") is not None else 1.0,
        "background": bool(b.get("background")), "max_output_tokens": ctx.plans[0].limit,
        "max_tool_calls": b.get("max_tool_calls"),
        "previous_response_id": b.get("previous_response_id"), "prompt": None,
        "reasoning": b.get("reasoning"), "service_tier": b.get("service_tier", "auto"),
        "status": status, "text": b.get("text"), "top_logprobs": None,
        "truncation": b.get("truncation", "disabled"), "usage": usage_, "user": b.get("user"),
        "presence_penalty": None, "frequency_penalty": None,
        "kv_transfer_params": None, "ec_transfer_params": None,
        "input_messages": None, "output_messages": None,
    }


async def respond_stream(request: web.Request, ctx: RequestContext, deliveries: Deliveries
                         ) -> web.StreamResponse:
    """Stream the response's typed events (module docstring)."""
    b = _Builder(ctx)
    return await respond_typed_stream(request, ctx, deliveries, b.created, b.delta, b.completed)


async def respond_full(request: web.Request, ctx: RequestContext, deliveries: Deliveries
                       ) -> web.Response:
    """Wait for the output and answer the response object (module docstring)."""
    faulty = await collect(request, ctx, deliveries)
    if faulty is not None:
        return faulty
    plan = ctx.plans[0]
    text = "".join(t for k, t in plan.items if k == "c")
    thought = "".join(t for k, t in plan.items if k == "r")
    name = next((t for k, t in plan.items if k == "h"), None)
    output: list[dict[str, Any]] = []
    if thought:
        sealed = reasoning_signature(thought) if encrypted(ctx) else None
        output.append(reasoning_item(P.random_id("rs_"), thought, "completed", sealed))
    if text or name is None:
        output.append(message(P.random_id("msg_"), text))
    if name is not None:
        args = "".join(t for k, t in plan.items if k == "a")
        output.append(function_call(P.random_id("fc_"), P.random_id("chatcmpl-tool-"), name,
                                    args, "completed"))
    status = "incomplete" if plan.finish == "length" else "completed"
    obj = response_object(ctx, status, output, usage(ctx))
    return web.Response(body=orjson.dumps(obj), content_type="application/json")
