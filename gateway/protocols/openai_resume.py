"""Mid-stream resume for OpenAI chat and legacy completions streams: what the client already
got (``resume_point``), the continuation request (``continuation_body``) and the codec that
splices the continuation's chunks into the client's stream (``OpenAISplice``).

Nothing here runs while a stream flows: the relay keeps references to the raw payloads it sent
and these functions read them once, after a break. The continuation asks vLLM to continue the
partial assistant message (chat: the conversation plus an assistant message holding the text,
``continue_final_message: true``, ``add_generation_prompt: false``, vLLM's chat-template
options; completions: the prompt plus the text), with ``max_tokens`` /
``max_completion_tokens`` reduced by the output tokens already produced.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.common.usage import Usage
from gateway.errors import GatewayError, UpstreamError, stream_error
from gateway.protocols.base import CONTENT, DONE, ERROR, SKIP, ResumePoint, StreamCodec
from gateway.relay.body import ParsedBody
from gateway.relay.sse import DONE_EVENT, SSEEvent, encode_event
from gateway.telemetry.tokencount import count_text

# what a chat delta may carry besides ``role``: a chunk with none of it (and no finish reason,
# logprobs or usage) is the continuation's opening role chunk, which the client already had
_DELTA_OUTPUT = ("content", "reasoning", "reasoning_content", "tool_calls", "refusal")


def resume_point(body: ParsedBody, relayed: list[bytes], *, chat: bool) -> ResumePoint:
    """The text relayed on choice 0 of an OpenAI stream (chat: ``delta.content`` and
    ``delta.reasoning``/``reasoning_content``; completions: ``text``), the stream's id and
    created time, and the blocker when it cannot be continued (``ResumePoint``)."""
    doc = body.doc
    point = ResumePoint()
    if (doc.get("n") or 1) != 1 or (not chat and (doc.get("best_of") or 1) != 1):
        point.blocker = "n>1"
    elif is_structured(doc):
        point.blocker = "structured-output"
    elif not chat and doc.get("echo"):
        point.blocker = "echo"
    elif not chat and not isinstance(doc.get("prompt"), str):
        point.blocker = "prompt"
    text: list[str] = []
    reasoning: list[str] = []
    finished: set[Any] = set()
    for data in relayed:
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(chunk, dict):
            continue
        if point.id is None and isinstance(chunk.get("id"), str):
            point.id, point.created = chunk["id"], chunk.get("created")
        for c in chunk.get("choices") or ():
            if not isinstance(c, dict):
                continue
            if c.get("index", 0) != 0:
                point.blocker = point.blocker or "n>1"
            if c.get("finish_reason") is not None:
                point.blocker = point.blocker or "finished"
                finished.add(c.get("index", 0))
            if not chat:
                if isinstance(c.get("text"), str):
                    text.append(c["text"])
                continue
            delta = c.get("delta")
            if not isinstance(delta, dict):
                continue
            if delta.get("tool_calls"):
                point.blocker = point.blocker or "tool-call"
            if isinstance(delta.get("content"), str):
                text.append(delta["content"])
            for key in ("reasoning", "reasoning_content"):
                if isinstance(delta.get(key), str):
                    reasoning.append(delta[key])
    want = doc.get("n") or 1
    point.complete = isinstance(want, int) and len(finished) >= want
    point.text, point.reasoning = "".join(text), "".join(reasoning)
    point.tokens = count_text(point.text) + count_text(point.reasoning)
    if point.text:
        point.heal = heal_tail(point.text)
    elif point.reasoning:
        point.heal, point.heal_field = heal_tail(point.reasoning), "reasoning"
    return point


# Longest tail left out of a continuation's prompt (characters): a word cut mid-way is
# regenerated from the whitespace before it. A longer run without whitespace (code, CJK text)
# is carried whole: no boundary in it is known to re-tokenize as the engine produced it.
MAX_HEAL_CHARS = 48


def heal_tail(text: str) -> str:
    """The end of ``text`` a continuation regenerates instead of carrying: the last run of
    non-whitespace characters (a word perhaps cut mid-way) with the whitespace before it, or
    the trailing whitespace when ``text`` ends with some; ``""`` when that is longer than
    ``MAX_HEAL_CHARS``.

    Why: BPE tokenizers (byte-level ones as GPT-2's and Llama 3's, SentencePiece's) split text
    into pre-tokens at whitespace before merging, so text up to a whitespace boundary
    re-tokenizes into the tokens the engine produced, whereas a word cut mid-way ("the fast l"
    of " lane") may re-tokenize into tokens the engine never produced ("l" for " l"), after
    which the model continues from a context it would never have generated (seen with real vLLM
    in ``tests/integration_vllm/test_resume_vllm.py``). Token healing (Microsoft ``guidance``)
    answers the same problem for prompts."""
    end = len(text)
    i = end
    while i > 0 and not text[i - 1].isspace():
        i -= 1
    while i > 0 and text[i - 1].isspace():
        i -= 1
    return text[i:] if end - i <= MAX_HEAL_CHARS else ""


# vLLM's constrained decoding: its older ``guided_*`` fields and ``structured_outputs``
# (vllm/entrypoints/openai/protocol.py), besides OpenAI's ``response_format``
GUIDED_FIELDS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar",
                 "structured_outputs")


def is_structured(doc: dict[str, Any]) -> bool:
    """True when the request constrains its output: ``response_format`` of type
    ``json_schema``/``json_object`` (``text`` does not), or any of ``GUIDED_FIELDS`` set.
    Such a stream is not continued with ``continue_final_message``: the engine's grammar
    restarts at the continuation (it would open a second JSON value mid-way)."""
    fmt = doc.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") not in (None, "text"):
        return True
    return any(doc.get(key) is not None for key in GUIDED_FIELDS)


def continuation_body(
    body: ParsedBody, served_model: str, point: ResumePoint, *, chat: bool,
    priority: int | None = None,
) -> bytes:
    """The request continuing ``point``: the client's body with ``model`` the engine's,
    ``stream`` and ``stream_options.include_usage`` on (its usage is summed into the client's),
    the output limits reduced by ``point.tokens`` (at least 1), and the partial output appended
    (chat: to a final assistant message, the client's own prefill extended when it sent one;
    completions: to the prompt). ``priority``: vLLM's field, as for the first attempt."""
    doc: dict[str, Any] = dict(body.doc)
    doc["model"] = served_model
    doc["stream"] = True
    opts = dict(doc.get("stream_options") or {})
    opts["include_usage"] = True
    opts.pop("continuous_usage_stats", None)
    doc["stream_options"] = opts
    text, reasoning = point.text, point.reasoning
    cut = len(point.heal)
    if cut and point.heal_field == "content":
        text = text[:-cut]
    elif cut:
        reasoning = reasoning[:-cut]
    for key in ("max_tokens", "max_completion_tokens"):
        if isinstance(doc.get(key), int):  # the healed tail is generated again
            doc[key] = max(1, doc[key] - point.tokens + count_text(point.heal))
    if priority is not None:
        doc["priority"] = int(priority)
    if not chat:
        doc["prompt"] = doc["prompt"] + text
        return orjson.dumps(doc)
    messages = list(doc["messages"])
    last = messages[-1]
    if doc.get("continue_final_message") and last.get("role") == "assistant":
        merged = dict(last)  # the client's own prefill, continued further
        merged["content"] = (last.get("content") or "") + text
        messages[-1] = merged
    else:
        prefix: dict[str, Any] = {"role": "assistant", "content": text}
        if reasoning:  # vLLM's chat templates read an assistant turn's ``reasoning``
            prefix["reasoning"] = reasoning
        messages.append(prefix)
    doc["messages"] = messages
    doc["continue_final_message"] = True
    doc["add_generation_prompt"] = False
    return orjson.dumps(doc)


def stream_ending(
    rewriter: Any, relayed: list[bytes], usage: Usage | None,
    ident: tuple[str | None, int | None] = (None, None),
) -> bytes:
    """The end of an OpenAI stream whose every choice finished before the engine broke it:
    a usage chunk with ``usage`` (None: none sent) shaped as the engine's (``choices: []``,
    the last relayed chunk's ``id``, ``object``, ``created``, ``model`` and
    ``system_fingerprint``; ``ident`` overrides id and created, as a continuation's splice
    does), rewritten for the client by ``rewriter``, then ``data: [DONE]``."""
    if usage is None:
        return DONE_EVENT
    last: dict[str, Any] = {}
    for data in reversed(relayed):
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        if isinstance(doc, dict):
            last = doc
            break
    chunk = {k: last[k] for k in ("id", "object", "created", "model", "system_fingerprint")
             if k in last}
    ident_id, created = ident
    if ident_id is not None:
        chunk["id"] = ident_id
    if created is not None:
        chunk["created"] = created
    chunk["choices"] = []
    chunk["usage"] = {"prompt_tokens": usage.prompt, "completion_tokens": usage.completion,
                      "total_tokens": usage.prompt + usage.completion}
    return encode_event(rewriter.body(chunk)) + DONE_EVENT


def summed_usage(last: Usage, carried: list[int]) -> Usage:
    """Usage of a resumed request, the sum of its attempts: ``last`` is the finishing
    attempt's (engine-reported); each broken attempt ``j`` produced ``carried[j]`` output
    tokens (estimated) on a prompt of ``last.prompt`` minus the tokens carried from it and every
    later broken attempt (the continuation's prompt holds them). Cached tokens: the finishing
    attempt's only (the broken attempts never reported theirs)."""
    prompt, completion = last.prompt, last.completion
    after = 0
    for tokens in reversed(carried):
        after += tokens
        prompt += max(0, last.prompt - after)
        completion += tokens
    return Usage(prompt, completion, last.cached)


class OpenAISplice(StreamCodec):
    """Codec of a continuation stream spliced into ``base``'s: each chunk gets the client
    stream's ``id`` and ``created`` (then ``base``'s model and ``service_tier`` rewrite), the
    continuation's role chunk is dropped, and its usage is the sum of the attempts (on the
    chunk that carries it when the client asked for usage; dropped otherwise). Continuations
    are rare: this codec parses and re-serialises each chunk.

    Token healing (``ResumePoint.heal``): the continuation's output starts with the tail the
    client already has; it is dropped from the chunks (with the logprobs of its tokens) and the
    event's payload replaced by the healed one, so ``relayed`` holds what the client got. When
    the output does not start with that tail (sampling chose another word), ``diverged`` is set
    and the chunk is an error: the relay continues again, carrying the whole text."""

    __slots__ = ("base", "carried", "diverged", "field", "ident", "pending")

    def __init__(self, base: Any, point: ResumePoint, carried: list[int]) -> None:
        super().__init__()
        self.base = base  # the stream's OpenAIStream (its rewriter and strip_usage)
        self.carried = list(carried)
        self.ident = (point.id, point.created)
        self.pending = point.heal  # the healed tail not yet seen again
        self.field = point.heal_field
        self.diverged = False

    def event(self, ev: SSEEvent) -> tuple[int, bytes]:
        data = ev.data
        assert data is not None
        if ev.is_done:
            return DONE, DONE_EVENT
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError:
            doc = None
        if not isinstance(doc, dict):
            self.error = UpstreamError("engine sent a malformed event mid-stream")
            return ERROR, self.error_event(self.error)
        choices = doc.get("choices")
        if "error" in doc and not choices:
            self.error = stream_error(doc)
            return ERROR, self.error_event(self.error)
        if isinstance(choices, list) and choices:
            if _opening_only(choices):
                return SKIP, b""
            if self.pending:
                kept = self._heal(choices[0])
                if kept is None:
                    self.diverged = True
                    self.error = UpstreamError(
                        "the continuation's output diverged from the text already relayed")
                    return ERROR, self.error_event(self.error)
                if not kept and doc.get("usage") is None:
                    return SKIP, b""
                ev.data = orjson.dumps(doc)  # what the client gets: ``relayed`` keeps it
            for c in choices:  # the client had its role already
                delta = c.get("delta")
                if isinstance(delta, dict):
                    delta.pop("role", None)
        usage = Usage.from_openai(doc.get("usage"))
        if usage is not None:
            total = summed_usage(usage, self.carried)
            self.usage = total
            if self.base.strip_usage:
                if not choices:
                    return SKIP, b""
                del doc["usage"]
            else:
                doc["usage"] = _usage_object(doc["usage"], total)
        ident, created = self.ident
        if ident is not None:
            doc["id"] = ident
        if created is not None:
            doc["created"] = created
        return CONTENT, encode_event(self.base.rewriter.chunk(orjson.dumps(doc), doc))

    def _heal(self, choice: Any) -> bool | None:
        """Drop from ``choice`` (choice 0 of a chunk, edited in place) the part of its text that
        repeats ``pending``. True: the choice still carries output, a finish reason or
        logprobs; False: nothing is left of it; None: its output is not ``pending``'s
        continuation (diverged)."""
        if not isinstance(choice, dict):
            return True
        delta = choice.get("delta")
        chat = isinstance(delta, dict)
        holder: dict[str, Any] = delta if chat else choice  # type: ignore[assignment]
        keys = ("text",) if not chat else (
            ("content",) if self.field == "content" else ("reasoning", "reasoning_content"))
        key = next((k for k in keys if isinstance(holder.get(k), str) and holder[k]), None)
        if key is None:  # other output before the tail came back: another path was taken
            others = _DELTA_OUTPUT if chat else ()
            if any(holder.get(k) for k in others if k not in keys):
                return None
            return _carries(choice)
        piece: str = holder[key]
        n = min(len(piece), len(self.pending))
        if piece[:n] != self.pending[:n]:
            return None
        self.pending = self.pending[n:]
        _drop_logprobs(choice, n, chat)
        if piece[n:]:
            holder[key] = piece[n:]
            return True
        del holder[key]
        return _carries(choice)

    def error_event(self, err: GatewayError) -> bytes:
        return self.base.error_event(err)

    def continuation(self, point: ResumePoint, carried: list[int]) -> StreamCodec:
        return OpenAISplice(self.base, point, carried)

    def ending(self, usage: Usage | None, relayed: list[bytes]) -> bytes | None:
        return self.base.ending_after(self.usage, usage, relayed, self.ident)


def _opening_only(choices: list[Any]) -> bool:
    """True for the continuation's role chunk: ``delta`` with ``role`` and nothing else."""
    for c in choices:
        if not isinstance(c, dict):
            return False
        delta = c.get("delta")
        if not isinstance(delta, dict) or "role" not in delta:
            return False
        if c.get("finish_reason") is not None or c.get("logprobs"):
            return False
        if any(delta.get(k) for k in _DELTA_OUTPUT):
            return False
    return True


def _carries(choice: dict[str, Any]) -> bool:
    """True when a choice has anything for the client: output, a finish reason, logprobs."""
    if choice.get("finish_reason") is not None:
        return True
    lp = choice.get("logprobs")
    if isinstance(lp, dict) and (lp.get("content") or lp.get("tokens")):
        return True
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return any(delta.get(k) for k in _DELTA_OUTPUT)
    return bool(choice.get("text"))


def _drop_logprobs(choice: dict[str, Any], chars: int, chat: bool) -> None:
    """Drop from ``choice``'s logprobs the leading tokens whose text lies within its first
    ``chars`` characters (the healed tail the client had, with its own logprobs)."""
    lp = choice.get("logprobs")
    if not isinstance(lp, dict) or chars <= 0:
        return
    tokens = ([e.get("token") if isinstance(e, dict) else None for e in lp.get("content") or ()]
              if chat else list(lp.get("tokens") or ()))
    k, seen = 0, 0
    while k < len(tokens) and isinstance(tokens[k], str) and seen + len(tokens[k]) <= chars:
        seen += len(tokens[k])
        k += 1
    if not k:
        return
    if chat:
        lp["content"] = lp["content"][k:]
        return
    for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        if isinstance(lp.get(name), list):
            lp[name] = lp[name][k:]


def _usage_object(engine: dict[str, Any], total: Usage) -> dict[str, Any]:
    """The engine's usage object with the summed counts (its other keys kept)."""
    out = dict(engine)
    out["prompt_tokens"] = total.prompt
    out["completion_tokens"] = total.completion
    out["total_tokens"] = total.prompt + total.completion
    details = out.get("prompt_tokens_details")
    if isinstance(details, dict):
        out["prompt_tokens_details"] = {**details, "cached_tokens": total.cached}
    return out
