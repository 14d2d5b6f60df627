"""Token counting with tiktoken that works offline: the estimate used when an engine reports no
usage (or the stream broke before its usage chunk), and for admission estimates.

tiktoken downloads its encoding files at first use; gateways often run without internet. The
two encodings ship with the package as ``gateway/data/{name}.tiktoken.gz`` (tiktoken's own
``.tiktoken`` files, gzip'd) and are loaded here directly, never through tiktoken's download
path, so no network access is ever attempted. The uncompressed bytes are checked against the
SHA-256 that tiktoken itself pins (``tiktoken_ext/openai_public.py``), so they are provably the
official files; ``pat_str`` and special tokens are copied from the same module (tiktoken, MIT
licence) and a unit test checks they still match. ``cl100k_base`` is the default: the closest
public encoding to the Llama 3 and Qwen tokenizers the engines usually serve (both extend its
BPE), so counts are estimates for those models and exact for OpenAI models of that encoding.

Chat prompts are counted with the rule of OpenAI's cookbook "How to count tokens with tiktoken"
(``num_tokens_from_messages``, gpt-3.5-turbo-0613 / gpt-4 / gpt-4o family): 3 tokens per
message, the tokens of every string field, +1 when the message has a ``name``, and +3 for the
assistant reply priming. Fields that are not strings are the gateway's extension of that rule:
``content`` as an array counts the ``text`` of its text parts; ``tool_calls`` count each call's
function ``name`` and ``arguments`` (plus ``id``); ``tools`` (function definitions) count their
compact JSON. Images and audio are not counted.

Encoding costs ~35-70 ns per character on one core (measured: 4 KiB of English in ~0.2 ms,
32 KiB in 1.2-2.2 ms): ``count_*_async`` move inputs above ``OFFLOAD_CHARS`` to a worker thread
(``asyncio.to_thread``, ~45 µs per hand-off) so a 1M-token prompt never blocks the event loop;
loading an encoding (~0.3 s) should happen once at startup (``warm_up``).
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import hashlib
import threading
from importlib import resources
from typing import Any, Literal

import orjson
import tiktoken

from gateway.common.usage import Usage
from gateway.telemetry.block_count import BLOCK_CHARS, MAX_ENTRIES, BlockCounts

EncodingName = Literal["cl100k_base", "o200k_base"]
DEFAULT_ENCODING: EncodingName = "cl100k_base"

# Inputs longer than this (characters, or request bytes) are counted in a worker thread: inline
# counting then blocks the event loop for at most ~0.2-0.4 ms (see the module docstring).
OFFLOAD_CHARS = 4 * 1024

# OpenAI cookbook, "How to count tokens with tiktoken", num_tokens_from_messages().
TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMING_TOKENS = 3

_ENDOFTEXT = "<|endoftext|>"
_ENDOFPROMPT = "<|endofprompt|>"

# From tiktoken_ext/openai_public.py (tiktoken 0.14.0, MIT licence): expected SHA-256 of the
# ``.tiktoken`` file, the pre-tokenisation regex and the special tokens of each encoding.
_SPECS: dict[str, dict[str, Any]] = {
    "cl100k_base": {
        "sha256": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        "pat_str": (
            r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+|"""
            r""" ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
        ),
        "special_tokens": {
            _ENDOFTEXT: 100257,
            "<|fim_prefix|>": 100258,
            "<|fim_middle|>": 100259,
            "<|fim_suffix|>": 100260,
            _ENDOFPROMPT: 100276,
        },
    },
    "o200k_base": {
        "sha256": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        "pat_str": "|".join(
            [
                r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
                r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
                r"""\p{N}{1,3}""",
                r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
                r"""\s*[\r\n]+""",
                r"""\s+(?!\S)""",
                r"""\s+""",
            ]
        ),
        "special_tokens": {_ENDOFTEXT: 199999, _ENDOFPROMPT: 200018},
    },
}

_cache: dict[str, tiktoken.Encoding] = {}
_lock = threading.Lock()


class EncodingDataError(RuntimeError):
    """The bundled encoding file is missing or does not match tiktoken's pinned hash."""


def _load_ranks(name: str) -> dict[bytes, int]:
    spec = _SPECS[name]
    try:
        packed = resources.files("gateway").joinpath(f"data/{name}.tiktoken.gz").read_bytes()
    except OSError as e:
        raise EncodingDataError(f"bundled encoding {name} not found: {e}") from None
    data = gzip.decompress(packed)
    if hashlib.sha256(data).hexdigest() != spec["sha256"]:
        raise EncodingDataError(f"bundled encoding {name} does not match tiktoken's SHA-256")
    # The format of tiktoken.load.load_tiktoken_bpe: "<base64 token> <rank>" per line.
    ranks: dict[bytes, int] = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def get_encoding(name: EncodingName = DEFAULT_ENCODING) -> tiktoken.Encoding:
    """The tiktoken ``Encoding`` ``name`` built from the bundled file (no network, cached).

    Raises ``KeyError`` for an unknown name and ``EncodingDataError`` for a bad data file.
    """
    enc = _cache.get(name)
    if enc is not None:
        return enc
    if name not in _SPECS:
        raise KeyError(f"unknown encoding {name!r}; bundled: {sorted(_SPECS)}")
    with _lock:
        enc = _cache.get(name)
        if enc is None:
            spec = _SPECS[name]
            enc = tiktoken.Encoding(
                name=name,
                pat_str=spec["pat_str"],
                mergeable_ranks=_load_ranks(name),
                special_tokens=spec["special_tokens"],
            )
            _cache[name] = enc
    return enc


async def warm_up(name: EncodingName = DEFAULT_ENCODING) -> None:
    """Load ``name`` in a worker thread (call once at startup: loading takes ~0.3 s)."""
    await asyncio.to_thread(get_encoding, name)


def count_text(text: str, encoding: EncodingName = DEFAULT_ENCODING) -> int:
    """Tokens of ``text``; special-token text such as ``<|endoftext|>`` counts as plain text."""
    if not text:
        return 0
    return len(get_encoding(encoding).encode_ordinary(text))


def _content_texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    out: list[str] = []
    if isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                out.append(part["text"])
            elif isinstance(part, str):
                out.append(part)
    return out


def _message_texts(message: dict[str, Any]) -> list[str]:
    texts: list[str] = []
    for key, value in message.items():
        if key == "content":
            texts.extend(_content_texts(value))
        elif key == "tool_calls" and isinstance(value, list):
            for call in value:
                if not isinstance(call, dict):
                    continue
                if isinstance(call.get("id"), str):
                    texts.append(call["id"])
                fn = call.get("function")
                if isinstance(fn, dict):
                    texts.extend(
                        v for k in ("name", "arguments") if isinstance(v := fn.get(k), str)
                    )
        elif isinstance(value, str):
            texts.append(value)
    return texts


#: Counts cached per prefix block: later turns of a session encode only their new blocks.
BLOCKS = BlockCounts()


def configure_cache(max_entries: int = MAX_ENTRIES, block_chars: int = BLOCK_CHARS) -> None:
    """Replace ``BLOCKS`` by an empty cache of at most ``max_entries`` blocks of
    ``block_chars`` characters (the ``telemetry.token_count_cache_*`` settings; at startup)."""
    global BLOCKS
    BLOCKS = BlockCounts(max_entries, block_chars)


def count_chat_prompt(doc: dict[str, Any], encoding: EncodingName = DEFAULT_ENCODING) -> int:
    """Prompt tokens of a ``/v1/chat/completions`` request document (``messages``, ``tools``)
    by the cookbook rule (module docstring). The message texts are counted through ``BLOCKS``
    (per prefix block), so each turn of a growing conversation encodes only what is new."""
    enc = get_encoding(encoding)
    total = 0

    def encode_len(text: str) -> int:
        return len(enc.encode_ordinary(text))

    messages = doc.get("messages")
    if isinstance(messages, list):
        texts: list[str] = []
        for message in messages:
            if not isinstance(message, dict):
                continue
            total += TOKENS_PER_MESSAGE
            texts.extend(_message_texts(message))
            if "name" in message:
                total += TOKENS_PER_NAME
        total += REPLY_PRIMING_TOKENS + BLOCKS.count(encoding, texts, encode_len)
    tools = doc.get("tools")
    if tools:
        total += len(enc.encode_ordinary(orjson.dumps(tools).decode()))
    return total


def count_completion_prompt(doc: dict[str, Any], encoding: EncodingName = DEFAULT_ENCODING) -> int:
    """Prompt tokens of a ``/v1/completions`` request: ``prompt`` as a string, a list of
    strings, a list of token ids or a list of such lists (token ids count as given)."""
    prompt = doc.get("prompt")
    if isinstance(prompt, str):  # a growing prompt string: per prefix block too
        enc = get_encoding(encoding)
        return BLOCKS.count(encoding, [prompt], lambda t: len(enc.encode_ordinary(t)))
    if not isinstance(prompt, list):
        return 0
    if all(isinstance(p, int) for p in prompt):
        return len(prompt)
    total = 0
    for p in prompt:
        if isinstance(p, str):
            total += count_text(p, encoding)
        elif isinstance(p, list):
            total += len(p)
    return total


def count_prompt(
    doc: dict[str, Any],
    kind: Literal["chat", "completion"],
    encoding: EncodingName = DEFAULT_ENCODING,
) -> int:
    """Prompt tokens of a request document of ``kind`` (the handler's endpoint kind)."""
    if kind == "chat":
        return count_chat_prompt(doc, encoding)
    return count_completion_prompt(doc, encoding)


async def count_prompt_async(
    doc: dict[str, Any],
    kind: Literal["chat", "completion"],
    *,
    size_hint: int,
    encoding: EncodingName = DEFAULT_ENCODING,
) -> int:
    """``count_prompt`` inline for small requests, in a worker thread when ``size_hint`` (the
    request body's length in bytes) exceeds ``OFFLOAD_CHARS``."""
    if size_hint > OFFLOAD_CHARS:
        return await asyncio.to_thread(count_prompt, doc, kind, encoding)
    return count_prompt(doc, kind, encoding)


async def count_text_async(text: str, encoding: EncodingName = DEFAULT_ENCODING) -> int:
    """``count_text`` inline for short text, in a worker thread above ``OFFLOAD_CHARS``."""
    if len(text) > OFFLOAD_CHARS:
        return await asyncio.to_thread(count_text, text, encoding)
    return count_text(text, encoding)


def completion_text(chunks: list[bytes]) -> str:
    """The generated text of relayed stream chunks (SSE ``data`` payloads, JSON), for counting
    output tokens of a stream that ended without usage: every choice's ``delta.content``,
    ``delta.reasoning`` (vLLM ≥ 0.32) or ``reasoning_content``, tool-call ``arguments`` and
    names (chat) or ``text`` (completions). Payloads that are not JSON objects (``[DONE]``,
    errors) are skipped."""
    parts: list[str] = []
    for data in chunks:
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        choices = doc.get("choices") if isinstance(doc, dict) else None
        if not isinstance(choices, list):
            continue
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            if isinstance(choice.get("text"), str):
                parts.append(choice["text"])
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                continue
            for key in ("content", "reasoning", "reasoning_content"):
                if isinstance(delta.get(key), str):
                    parts.append(delta[key])
            for call in delta.get("tool_calls") or ():
                fn = call.get("function") if isinstance(call, dict) else None
                if isinstance(fn, dict):
                    parts.extend(
                        v for k in ("name", "arguments") if isinstance(v := fn.get(k), str)
                    )
    return "".join(parts)


def response_text(doc: dict[str, Any]) -> str:
    """The generated text of a non-streaming response document: every choice's
    ``message.content``, ``message.reasoning`` or ``reasoning_content`` and tool-call names
    and ``arguments`` (chat) or ``text`` (completions)."""
    parts: list[str] = []
    for choice in doc.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        if isinstance(choice.get("text"), str):
            parts.append(choice["text"])
        msg = choice.get("message")
        if not isinstance(msg, dict):
            continue
        for key in ("content", "reasoning", "reasoning_content"):
            if isinstance(msg.get(key), str):
                parts.append(msg[key])
        for call in msg.get("tool_calls") or ():
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict):
                parts.extend(v for k in ("name", "arguments") if isinstance(v := fn.get(k), str))
    return "".join(parts)


def estimate_usage_sync(
    doc: dict[str, Any],
    kind: Literal["chat", "completion"],
    output_text: str,
    encoding: EncodingName = DEFAULT_ENCODING,
) -> Usage:
    """Usage counted by the gateway: the request's prompt and ``output_text`` (no cached part:
    only the engine knows what its prefix cache served)."""
    return Usage(
        prompt=count_prompt(doc, kind, encoding),
        completion=count_text(output_text, encoding),
    )


async def estimate_usage(
    doc: dict[str, Any],
    kind: Literal["chat", "completion"],
    output_text: str,
    *,
    size_hint: int,
    encoding: EncodingName = DEFAULT_ENCODING,
) -> Usage:
    """``estimate_usage_sync`` inline for small inputs, in one worker thread when the request
    body (``size_hint`` bytes) plus the output exceed ``OFFLOAD_CHARS``. For a request the
    engine answered without usage (or a stream that broke before its usage chunk); mark the
    record ``usage_estimated``. ``output_text``: ``completion_text(chunks)`` of a stream or
    ``response_text(doc)`` of a JSON response."""
    if size_hint + len(output_text) > OFFLOAD_CHARS:
        return await asyncio.to_thread(estimate_usage_sync, doc, kind, output_text, encoding)
    return estimate_usage_sync(doc, kind, output_text, encoding)
