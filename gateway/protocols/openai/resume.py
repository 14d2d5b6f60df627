"""Mid-stream resume for OpenAI chat and legacy completions streams: what the client already
got (``resume_point``), and the continuation request (``continuation_body``); the codec that
splices the continuation's chunks into the client's stream is ``openai.splice.OpenAISplice``.

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

from gateway.protocols.base import ResumePoint
from gateway.protocols.body import ParsedBody
from gateway.protocols.openai.splice import delta_reasoning
from gateway.telemetry.tokencount import count_text


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
    elif doc.get("echo"):  # vLLM would echo the carried text at the continuation's start
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
            thought = delta_reasoning(delta)
            if thought is not None:
                reasoning.append(thought)
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
    the output limits reduced by the carried text's tokens (the engine's count,
    ``point.carried_tokens``, else the estimate; at least 1), and the partial output appended
    (chat: to a final assistant message, the client's own prefill extended when it sent one;
    completions: to the prompt). ``priority``: vLLM's field, as for the first attempt."""
    doc: dict[str, Any] = dict(body.doc)
    doc["model"] = served_model
    doc["stream"] = True
    opts = dict(doc.get("stream_options") or {})
    opts["include_usage"] = True
    opts.pop("continuous_usage_stats", None)
    doc["stream_options"] = opts
    text, reasoning = point.carried()
    produced = point.carried_tokens  # the engine's count of the carried text, when it said
    if produced is None:  # else the estimate: the healed tail is generated again
        produced = point.tokens - count_text(point.heal)
    for key in ("max_tokens", "max_completion_tokens"):
        if isinstance(doc.get(key), int):
            doc[key] = max(1, doc[key] - produced)
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
        if reasoning:
            merged["reasoning"] = (last.get("reasoning") or "") + reasoning
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
