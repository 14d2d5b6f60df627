"""What a request is routed by: its session key and the chain hash of its prefix blocks.

**Session key**: the ``x-session-id`` header when present (a long one as its
fixed-size digest, ``gateway.common.ids.bounded_id``), else a hash of the
leading messages (every message up to and including the first ``user`` message, e.g. the system
prompt and the task), so an agent that sends no header still sticks: later turns resend the
same leading messages. Completions (``prompt``) use the prompt's first ``chunk_chars``.

**Prefix blocks**: the conversation as a chain of blocks, like vLLM's prefix cache hashes token
blocks (``hash(parent, block)``) but without tokenizing: each message (role, content, tool
calls) is cut into fixed-size character chunks (the last chunk of a message is shorter), and
block ``i``'s hash covers blocks ``0..i``. Turn N+1 of a session resends turn N's messages and
appends new ones, so it shares every block of turn N and adds only its own.

Hashes are 8-byte BLAKE2b digests: stable across processes (gateway replicas agree) and cheap
(BLAKE2b releases the GIL on large inputs; measured: ~10 ms for a 5 MiB conversation on one
core, see ``tests/unit/routing/test_routing_keys.py``). Only the first ``max_hash_chars``
characters are hashed; :func:`route_request` hashes large conversations in a worker thread so
the event loop never waits on them.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.common.blocks import block_spans
from gateway.common.ids import bounded_id

#: ``session_src`` of the sessions the gateway derives itself (``gateway.admit.session``):
#: a Responses chain's first response id, the conversation hash.
RESPONSES_CHAIN = "responses_chain"
CONVERSATION = "conversation"
#: Conversations with more characters than this are hashed in a worker thread.
THREAD_CHARS = 256 * 1024


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, dict):
                t = p.get("text")
                parts.append(t if isinstance(t, str) else orjson.dumps(p).decode())
            else:
                parts.append(str(p))
        return "\n".join(parts)
    return str(content)


def message_texts(doc: dict[str, Any]) -> list[str]:
    """The conversation as one string per message (role, content, tool calls, tool call id);
    a completions request's ``prompt`` as one string."""
    messages = doc.get("messages")
    if isinstance(messages, list):
        out = []
        for m in messages:
            if not isinstance(m, dict):
                out.append(str(m))
                continue
            s = f"{m.get('role', '')}\x00{_text(m.get('content'))}"
            if m.get("tool_calls"):
                s += "\x00" + orjson.dumps(m["tool_calls"]).decode()
            if m.get("tool_call_id"):
                s += f"\x00{m['tool_call_id']}"
            out.append(s)
        return out
    prompt = doc.get("prompt")
    if isinstance(prompt, str):
        return [prompt]
    if prompt is None:
        return []
    return [orjson.dumps(prompt).decode()]


def session_key(
    doc: dict[str, Any], header: str | None, lead_chars: int = 4096, scope: str | None = None
) -> str:
    """``"h:" + header`` when given (a header over ``MAX_ID_CHARS`` as its digest), else
    ``"p:" + hex`` of the leading messages (through the first user message, ``lead_chars`` of
    each at most; a completion's prompt start).
    ``scope`` (the API key's id when auth is on) keeps tenants' sessions apart even when they
    send the same session id or the same opening messages."""
    if header:
        header = bounded_id(header)
        return f"h:{scope}/{header}" if scope else "h:" + header
    h = hashlib.blake2b(digest_size=12)
    if scope:
        h.update(scope.encode() + b"\x02")
    messages = doc.get("messages")
    if isinstance(messages, list):
        for m in messages:
            if not isinstance(m, dict):
                continue
            h.update(f"{m.get('role', '')}\x00{_text(m.get('content'))[:lead_chars]}\x01".encode())
            if m.get("role") == "user":
                break
    else:
        texts = message_texts(doc)
        h.update((texts[0] if texts else "")[:lead_chars].encode())
    return "p:" + h.hexdigest()


def affinity_id(session_id: str | None, source: str | None, hint: str | None) -> str | None:
    """The id routing keys affinity by (``RouteRequest.from_doc``'s ``session_header``): the
    session id a client named (``gateway.admit.session``); for a session the gateway derived
    (``source`` ``RESPONSES_CHAIN`` or ``CONVERSATION``) or none yet, ``hint``
    (``ParsedBody.session_hint``: a chain's later turns; None: the conversation hash)."""
    if source in (RESPONSES_CHAIN, CONVERSATION):
        return hint
    return session_id or hint


def block_chain(texts: list[str], chunk_chars: int, max_chars: int) -> list[bytes]:
    """Chain hashes (8 bytes each) of the blocks of ``texts`` (``gateway.common.blocks``): each
    text cut in ``chunk_chars`` pieces (an empty text is one empty block); block ``i`` covers
    blocks ``0..i``. Stops after ``max_chars`` characters."""
    return [h for _, _, _, h in block_spans(texts, chunk_chars, max_chars)]


@dataclass(slots=True)
class RouteRequest:
    """One request's routing inputs, computed once and shared by every pool it tries.

    ``blocks`` by chunk size (pools may differ); ``lookups`` caches each pool's state-store
    answer across retries.
    """

    session_key: str
    texts: list[str]
    chars: int
    lead: int = 0  # texts before the first user message (system/developer preamble)
    blocks: dict[int, list[bytes]] = field(default_factory=dict)
    lookups: dict[str, Any] = field(default_factory=dict)
    tokens: int = 0  # prompt estimate + output cap, for the fit filter (routing.fit); 0 = unknown
    output_cap: int = 0  # the output tokens it asks for at most (part of ``tokens``)
    #: sent without its output cap (``plan.kv_fit``: prompt + cap fit no replica): on a
    #: replica it may grow to that replica's ``max_model_len`` (``routing.fit.tokens_on``);
    #: ``tokens`` is then the prompt + 1, ``output_cap`` 1
    fills_context: bool = False
    #: ``(asked cap, prompt tokens, largest context)`` when the cap was lowered, else None
    lowered_cap: tuple[int, int, int] | None = None
    #: "stay" | "move" | "wait" (``routing.kv_placement``) and its figures, for the access log
    kv_placement: str | None = None
    kv_figures: str | None = None

    @classmethod
    def from_doc(
        cls, doc: dict[str, Any], session_header: str | None, scope: str | None = None
    ) -> RouteRequest:
        """From the parsed body and the ``x-session-id`` header (None when absent); ``scope``
        (the API key id) namespaces the session key."""
        texts = message_texts(doc)
        lead = 0
        messages = doc.get("messages")
        if isinstance(messages, list):
            for m in messages:
                if isinstance(m, dict) and m.get("role") == "user":
                    break
                lead += 1
        return cls(
            session_key(doc, session_header, scope=scope), texts, sum(len(t) for t in texts), lead
        )

    def lead_blocks(self, chunk_chars: int) -> int:
        """Blocks of the preamble before the first user message (a system prompt shared by
        many sessions): a match that covers no more than these says nothing about the session."""
        return sum(max(1, -(-len(t) // chunk_chars)) for t in self.texts[: self.lead])

    async def chain(self, chunk_chars: int, max_chars: int) -> list[bytes]:
        """The block chain at ``chunk_chars`` (memoized); large ones hashed off the loop."""
        got = self.blocks.get(chunk_chars)
        if got is None:
            if min(self.chars, max_chars) > THREAD_CHARS:
                got = await asyncio.to_thread(block_chain, self.texts, chunk_chars, max_chars)
            else:
                got = block_chain(self.texts, chunk_chars, max_chars)
            self.blocks[chunk_chars] = got
        return got


def sampled_indices(n: int, stride: int = 16, tail: int = 32) -> list[int]:
    """Block indices to look up or record for a chain of ``n`` blocks, deepest first: the last
    ``tail`` blocks and every ``stride``-th block (absolute positions, so turn N+1 finds the
    blocks turn N recorded). Bounds the state-store keys per request to ``n/stride + tail``."""
    tail_start = max(0, n - tail)
    out = list(range(n - 1, tail_start - 1, -1))
    first = tail_start - 1
    first -= (first + 1) % stride
    out.extend(range(first, -1, -stride))
    return out
