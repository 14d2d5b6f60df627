"""The codec that splices a continuation's chunks into the client's OpenAI stream
(``OpenAISplice``: one id, one role chunk, the healed tail dropped, usage summed over the
attempts) and the end the gateway writes for a stream whose every choice finished before its
replica broke it (``stream_ending``). The continuation itself is ``openai.resume``'s."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.common.sse import DONE_EVENT, SSEEvent, encode_event
from gateway.common.usage import Usage
from gateway.errors import GatewayError, UpstreamError, stream_error
from gateway.protocols.base import CONTENT, DONE, ERROR, SKIP, ResumePoint, StreamCodec

# what a chat delta may carry besides ``role``: a chunk with none of it (and no finish reason,
# logprobs or usage) is the continuation's opening role chunk, which the client already had
_DELTA_OUTPUT = ("content", "reasoning", "reasoning_content", "tool_calls", "refusal")
# where a chat delta carries reasoning: vLLM's ``reasoning``, its older ``reasoning_content``;
# versions between the two send both, holding the same text
REASONING_KEYS = ("reasoning", "reasoning_content")


def delta_reasoning(delta: dict[str, Any]) -> str | None:
    """The reasoning text of a chat ``delta`` (read once when both keys carry it), or None."""
    for key in REASONING_KEYS:
        value = delta.get(key)
        if isinstance(value, str):
            return value
    return None


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
    keep = ("id", "object", "created", "model", "system_fingerprint")
    chunk: dict[str, Any] = {k: last[k] for k in keep if k in last}
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

    __slots__ = ("base", "carried", "diverged", "field", "ident", "offset", "pending")

    def __init__(self, base: Any, point: ResumePoint, carried: list[int]) -> None:
        super().__init__()
        self.base = base  # the stream's OpenAIStream (its rewriter and strip_usage)
        self.carried = list(carried)
        self.ident = (point.id, point.created)
        self.pending = point.heal  # the healed tail not yet seen again
        self.field = point.heal_field
        self.diverged = False
        # legacy completions' ``text_offset`` counts from the continuation's own output, which
        # starts after the carried text (vLLM's ``previous_text_lens``): shifted by its length
        self.offset = len(point.text) - (len(point.heal) if point.heal_field == "content" else 0)

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
            edited = False
            if self.pending:
                kept = self._heal(choices[0])
                if kept is None:
                    self.diverged = True
                    self.error = UpstreamError(
                        "the continuation's output diverged from the text already relayed")
                    return ERROR, self.error_event(self.error)
                if not kept and doc.get("usage") is None:
                    return SKIP, b""
                edited = True
            if self.offset:
                edited = _shift_offsets(choices, self.offset) or edited
            if edited:
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
        continuation (diverged): other output first, other text, or a finish other than
        ``length`` before the whole tail came back (the engine ended where the client's text
        goes on)."""
        if not isinstance(choice, dict):
            return True
        delta = choice.get("delta")
        chat = isinstance(delta, dict)
        holder: dict[str, Any] = delta if chat else choice  # type: ignore[assignment]
        keys = ("text",) if not chat else (
            ("content",) if self.field == "content" else REASONING_KEYS)
        present = [k for k in keys if isinstance(holder.get(k), str) and holder[k]]
        if not present:  # other output before the tail came back: another path was taken
            others = _DELTA_OUTPUT if chat else ()
            if any(holder.get(k) for k in others if k not in keys):
                return None
            return None if self._ended_early(choice) else _carries(choice)
        piece: str = holder[present[0]]
        n = min(len(piece), len(self.pending))
        if piece[:n] != self.pending[:n]:
            return None
        self.pending = self.pending[n:]
        if self._ended_early(choice):
            return None
        _drop_logprobs(choice, n, chat)
        for key in present:  # a version sending reasoning under both keys: both healed
            rest = holder[key][n:]
            if rest:
                holder[key] = rest
            else:
                del holder[key]
        return True if piece[n:] else _carries(choice)

    def _ended_early(self, choice: dict[str, Any]) -> bool:
        """True when ``choice`` finishes while part of the tail is still to come, for a reason
        other than the output limit."""
        return bool(self.pending) and choice.get("finish_reason") not in (None, "length")

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
    ``chars`` characters (the healed tail the client had, with its own logprobs). A token
    that straddles the tail's end (" lane" after the client had " l") keeps its entry, its
    ``token`` (and ``bytes``; completions: ``text_offset``) cut to the part the client did not
    have, so the tokens still spell the text; its ``logprob`` stays the whole token's."""
    lp = choice.get("logprobs")
    if not isinstance(lp, dict) or chars <= 0:
        return
    tokens = ([e.get("token") if isinstance(e, dict) else None for e in lp.get("content") or ()]
              if chat else list(lp.get("tokens") or ()))
    k, seen = 0, 0
    while k < len(tokens) and isinstance(t := tokens[k], str) and seen + len(t) <= chars:
        seen += len(t)
        k += 1
    cut = chars - seen  # characters of token ``k`` the client had
    token = tokens[k] if k < len(tokens) else None
    if chat:
        entries = lp["content"][k:] if k else lp.get("content")
        if k:
            lp["content"] = entries
        if cut and isinstance(token, str) and entries:
            entry = dict(entries[0])
            entry["token"] = token[cut:]
            if isinstance(entry.get("bytes"), list):
                entry["bytes"] = list(token[cut:].encode())
            entries[0] = entry
        return
    for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        if k and isinstance(lp.get(name), list):
            lp[name] = lp[name][k:]
    if cut and isinstance(token, str) and lp.get("tokens"):
        lp["tokens"][0] = token[cut:]
        offsets = lp.get("text_offset")
        if isinstance(offsets, list) and offsets and isinstance(offsets[0], int):
            offsets[0] += cut


def _shift_offsets(choices: list[Any], by: int) -> bool:
    """Add ``by`` to each legacy completions choice's ``logprobs.text_offset``; True when one
    was shifted."""
    shifted = False
    for c in choices:
        lp = c.get("logprobs") if isinstance(c, dict) else None
        offsets = lp.get("text_offset") if isinstance(lp, dict) else None
        if isinstance(lp, dict) and isinstance(offsets, list) and offsets:
            lp["text_offset"] = [o + by if isinstance(o, int) else o for o in offsets]
            shifted = True
    return shifted


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
