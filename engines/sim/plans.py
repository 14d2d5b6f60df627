"""What each choice will say: content pieces or a tool call, one item per output token. Pure.

A plan is decided up front (generated words, stop strings applied, tool arguments split), so
the scheduler knows each sequence's length and the handler maps delivered token counts to
items. Item kinds: ``"r"`` reasoning text, ``"c"`` content text, ``"h"`` tool-call header
(text = tool name), ``"a"`` tool-call arguments piece. What an agent turn says (tool or text,
arguments, reasoning, structured output, scripted turns) is decided in ``engines.sim.agent``.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from typing import Any

from engines.sim.agent import (
    REASONING_TOKENS,
    ScriptTurn,
    TurnPolicy,
    mix,
    script_turn,
    structured_output,
    tool_arguments,
    tool_to_call,
    wants_reasoning,
)
from engines.sim.faults import Faults
from engines.sim.textgen import Prompt, TextGen, split_text

PIECE_RE = re.compile(r"\s*(?:\w+|[^\w\s])|\s+")

DEFAULT_TOOL_ARGS_CHUNKS = 8


@dataclass(slots=True)
class Plan:
    """One choice: ``items`` (one per output token), its finish reason, and whether each item
    must be its own event (scripted ``chunks``, tool calls) or may coalesce (model text)."""

    index: int
    items: list[tuple[str, str]]
    finish: str
    scripted: bool
    pos: int = 0  # items already emitted
    limit: int = 0  # the output cap it was planned under (max_tokens, or the room left)

    @property
    def tokens(self) -> int:
        """Output tokens of this choice."""
        return len(self.items)


def apply_stop(pieces: list[str], stops: list[str]) -> tuple[list[str], bool]:
    """Cut ``pieces`` at the first stop string (excluded from the text, like vLLM).

    Keeps one item per token up to the token that completes the stop string; text at or after
    the stop is removed (those items become empty). Returns (items, stopped).
    """
    if not stops:
        return pieces, False
    text = "".join(pieces)
    best = -1
    best_end = 0
    for s in stops:
        if not s:
            continue
        i = text.find(s)
        if i >= 0 and (best < 0 or i < best):
            best, best_end = i, i + len(s)
    if best < 0:
        return pieces, False
    out: list[str] = []
    pos = 0
    for p in pieces:
        keep = max(0, min(len(p), best - pos))
        out.append(p[:keep])
        pos += len(p)
        if pos >= best_end:
            break
    return out, True


def make_plans(
    body: dict[str, Any],
    prompts: list[Prompt],
    n: int,
    max_tokens: list[int],
    natural_tokens: int,
    faults: Faults,
    gen: TextGen,
    chat: bool,
    prefix: str | None = None,
    policy: TurnPolicy | None = None,
) -> list[Plan]:
    """Plans for ``len(prompts) x n`` choices; choice index = ``prompt_index * n + i``.

    ``max_tokens[p]`` is prompt ``p``'s output limit; ``natural_tokens`` the length at which the
    model "emits EOS" (finish "stop") unless ``ignore_eos`` is set. ``prefix``: the assistant
    text already produced (``continue_final_message``); the plan continues it (``_continue``).
    ``policy``: the replica's agent-turn settings (default ``TurnPolicy()``).
    """
    stops = body.get("stop")
    if isinstance(stops, str):
        stop_list = [stops]
    else:
        stop_list = [s for s in stops or () if isinstance(s, str)]
    policy = policy or TurnPolicy()
    # a continued turn is decided as the turn it continues (without its partial message)
    decide = {**body, "messages": body["messages"][:-1]} if chat and prefix is not None else body
    turn = script_turn(faults.script, decide, faults.script_text_when) if chat else None
    think = chat and prefix is None and wants_reasoning(body)
    ignore_eos = bool(body.get("ignore_eos"))
    plans: list[Plan] = []
    for p, prompt in enumerate(prompts):
        for i in range(n):
            idx = p * n + i
            key = prompt.key + i
            reasoning: list[tuple[str, str]] = []
            if think:
                count = min(REASONING_TOKENS, max(0, max_tokens[p] - 1))
                reasoning = [("r", t) for t in gen.pieces(mix(prompt.key, "reasoning"), i, count)]
            if turn is not None and (turn.text is not None or turn.tool):
                plan = _scripted_turn(idx, turn, reasoning, prefix)
            else:  # past a script's end: a generated text answer
                tool = tool_to_call(decide, policy, key) if chat and turn is None else None
                fmt = structured_output(body, policy, key) if chat and tool is None else None
                plan = _plan(idx, body, prompt, i, max_tokens[p] - len(reasoning),
                             natural_tokens, faults, gen, tool, stop_list, ignore_eos, prefix,
                             policy, fmt)
                if reasoning:
                    plan.items[:0] = reasoning
            plan.limit = max_tokens[p]
            plans.append(plan)
    return plans


def _diverges(prefix: str | None, faults: Faults) -> bool:
    """The ``continuation_diverges`` fault applies: a continuation that regenerates a word
    (its carried text ends inside one; a whole text carried leaves nothing to diverge from)."""
    return (faults.continuation_diverges and prefix is not None
            and not prefix[-1:].isspace())


def _plan(
    idx: int, body: dict[str, Any], prompt: Prompt, i: int, limit: int, natural: int,
    faults: Faults, gen: TextGen, tool: str | None, stops: list[str], ignore_eos: bool,
    prefix: str | None = None, policy: TurnPolicy | None = None, structured: str | None = None,
) -> Plan:
    if faults.chunks is not None:
        after = faults.tool_call_after_chunks
        if after is None:
            chunks = _scripted_rest(faults.chunks, prefix or "")
            items = [("c", c) for c in chunks] or [("c", "")]
            if _diverges(prefix, faults):
                items[0] = ("c", "~" + items[0][1])
            return Plan(idx, items, "stop", True)
        name = tool or "tool"
        content = faults.chunks[:after]
        if prefix:  # the content before the call already produced: the script resumes after it
            content = [c for c in _scripted_rest(content, prefix) if c]
        items = [("c", c) for c in content]
        items.append(("h", name))
        items.extend(("a", c) for c in faults.chunks[after:])
        return Plan(idx, items, "tool_calls", True)
    if tool is not None:
        args = tool_arguments(body, tool, policy or TurnPolicy(), prompt.key + i)
        pieces = split_text(args, faults.tool_args_chunks or DEFAULT_TOOL_ARGS_CHUNKS)
        return Plan(idx, [("h", tool), *(("a", a) for a in pieces)], "tool_calls", True)
    if structured is not None:  # the whole JSON value unless the cap cuts it (vLLM: "length")
        pieces = PIECE_RE.findall(structured)
        cut = pieces[: max(1, limit)]
        return Plan(idx, [("c", t) for t in cut], "length" if len(cut) < len(pieces) else "stop",
                    False)
    natural = faults.output_tokens or natural
    if prefix is not None:
        pieces, natural = _continue(gen, prompt.key, i, prefix, limit, natural, ignore_eos)
    count = limit if ignore_eos else max(0, min(limit, natural))
    finish = "length" if count >= limit and (ignore_eos or limit < natural) else "stop"
    if prefix is None:
        pieces = gen.pieces(prompt.key, i, count)
    pieces = list(pieces[:count])
    if _diverges(prefix, faults) and pieces:
        pieces[0] = "~" + pieces[0]
    pieces, stopped = apply_stop(pieces, stops)
    if stopped:
        finish = "stop"
    if not pieces:
        pieces = [""]
    return Plan(idx, [("c", t) for t in pieces], finish, False)


def _scripted_turn(idx: int, turn: ScriptTurn, reasoning: list[tuple[str, str]],
                   prefix: str | None) -> Plan:
    """The plan of a scripted agent turn: ``reasoning``, the turn's text (one item per token,
    the part after ``prefix`` for a continued turn), then its tool call."""
    pieces = _scripted_rest(PIECE_RE.findall(turn.text or ""), prefix or "")
    items = [*reasoning, *(("c", t) for t in pieces if t)]
    if turn.tool is None:
        return Plan(idx, items or [("c", "")], "stop", True)
    args = split_text(turn.arguments_json(), DEFAULT_TOOL_ARGS_CHUNKS)
    items += [("h", turn.tool), *(("a", a) for a in args)]
    return Plan(idx, items, "tool_calls", True)


def _scripted_rest(chunks: list[str], prefix: str) -> list[str]:
    """The scripted ``chunks`` left after the assistant text ``prefix`` (a continued message
    resumes the script where the text stops; a prefix that is not the script's start leaves it
    whole)."""
    text = "".join(chunks)
    if not prefix or not text.startswith(prefix):
        return list(chunks)
    out: list[str] = []
    pos = 0
    for c in chunks:
        end = pos + len(c)
        if end > len(prefix):
            out.append(c[max(0, len(prefix) - pos):])
        pos = end
    return out


def _continue(
    gen: TextGen, key: int, i: int, prefix: str, limit: int, natural: int, ignore_eos: bool
) -> tuple[list[str], int]:
    """``(pieces after prefix, natural length left)`` for a continued assistant message.

    When ``prefix`` is the start of the words this prompt (``key``) draws, the continuation is
    those words from that offset on, so a turn cut and continued reads exactly like an
    uninterrupted one (a prefix ending inside a word continues with the rest of the word, one
    token); the natural length shrinks by the tokens already produced. Another prefix (a
    client's own prefill) continues with the words of the full prompt, a fresh turn."""
    probe = len(prefix) + 2  # a token is at least one character
    words = gen.pieces(key, i, probe)
    produced, k = 0, 0
    while k < len(words) and produced + len(words[k]) <= len(prefix):
        if not prefix.startswith(words[k], produced):
            break
        produced += len(words[k])
        k += 1
    if produced == len(prefix):
        left = natural - k
        return gen.pieces(key, i, k + max(0, limit if ignore_eos else min(limit, left)))[k:], left
    rest = prefix[produced:]
    if k < len(words) and words[k].startswith(rest):  # cut inside a word (one token)
        left = natural - k
        more = max(0, limit if ignore_eos else min(limit, left))
        out = gen.pieces(key, i, k + more)[k:]
        if out:
            out[0] = out[0][len(rest):]
        return out, left
    fresh = zlib.crc32(prefix.encode(), key)
    more = limit if ignore_eos else min(limit, natural)
    return gen.pieces(fresh, i, more), natural
