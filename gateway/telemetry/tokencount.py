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

Admission counts no further than it needs (``count_prompt_upto``): a prompt is refused by its
length alone when its UTF-8 bytes exceed ``max_token_chars`` (the encoding's longest token, 128
bytes) times the limit, and otherwise counting stops once the tokens counted plus the fewest
the rest can hold pass the limit (``BlockCounts.count_upto``). Without that, a prompt of 8 MiB
against 32k-token replicas was encoded whole (2-5 s, up to 400 MB) before its 400.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import hashlib
import threading
from importlib import resources
from typing import Any, Literal, NamedTuple

import orjson
import tiktoken

from gateway.common.usage import Usage
from gateway.telemetry.block_count import BLOCK_CHARS, MAX_ENTRIES, BlockCounts

# re-exported: the generated texts an estimate counts (``estimate_usage``'s ``output_text``)
from gateway.telemetry.output_text import completion_text as completion_text
from gateway.telemetry.output_text import response_text as response_text

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
_token_bytes: dict[str, int] = {}  # the longest token of each loaded encoding, in bytes
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
    return _build(name)[0]


def _build(name: str) -> tuple[tiktoken.Encoding, int]:
    """Load ``name`` once: its ``Encoding`` and its longest token in bytes."""
    if name not in _SPECS:
        raise KeyError(f"unknown encoding {name!r}; bundled: {sorted(_SPECS)}")
    with _lock:
        enc = _cache.get(name)
        if enc is None:
            spec = _SPECS[name]
            ranks = _load_ranks(name)
            _token_bytes[name] = max(map(len, ranks))
            enc = tiktoken.Encoding(
                name=name,
                pat_str=spec["pat_str"],
                mergeable_ranks=ranks,
                special_tokens=spec["special_tokens"],
            )
            _cache[name] = enc
    return enc, _token_bytes[name]


def max_token_chars(name: EncodingName = DEFAULT_ENCODING) -> int:
    """The most characters one token of ``name`` can cover: its longest token in bytes (128
    for ``cl100k_base`` and ``o200k_base``, a run of spaces), read from the encoding's own
    ranks, since a character is at least one UTF-8 byte. So a text of ``n`` characters has at
    least ``ceil(n / max_token_chars)`` tokens under ``encode_ordinary``: the bound that lets a
    prompt be refused by its length alone (``count_prompt_upto``)."""
    got = _token_bytes.get(name)
    return got if got is not None else _build(name)[1]


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


class PromptCount(NamedTuple):
    """A prompt's tokens as ``count_prompt_upto`` counted them. ``tokens``: the count, or, when
    ``stopped``, a lower bound of it that is more than the limit (the tokens encoded before the
    stop plus the fewest the rest can hold: ``max_token_chars``); ``stopped``: counting ended
    at the limit before the whole prompt was encoded."""

    tokens: int
    stopped: bool


def _chat_parts(doc: dict[str, Any]) -> tuple[int, list[str]]:
    """The fixed tokens of a chat request (the cookbook's per-message, name and reply priming
    tokens) and its texts to encode: the tools' compact JSON first (the same every turn, so its
    blocks are cached across a session), then every message's texts."""
    fixed, texts = 0, []
    tools = doc.get("tools")
    if tools:
        texts.append(orjson.dumps(tools).decode())
    messages = doc.get("messages")
    if isinstance(messages, list):
        for message in messages:
            if not isinstance(message, dict):
                continue
            fixed += TOKENS_PER_MESSAGE
            texts.extend(_message_texts(message))
            if "name" in message:
                fixed += TOKENS_PER_NAME
        fixed += REPLY_PRIMING_TOKENS
    return fixed, texts


def _completion_parts(doc: dict[str, Any]) -> tuple[int, list[str]]:
    """The tokens a ``/v1/completions`` prompt gives as ids and its texts to encode."""
    prompt = doc.get("prompt")
    if isinstance(prompt, str):
        return 0, [prompt]
    if not isinstance(prompt, list):
        return 0, []
    if all(isinstance(p, int) for p in prompt):
        return len(prompt), []
    ids = sum(len(p) for p in prompt if isinstance(p, list))
    return ids, [p for p in prompt if isinstance(p, str)]


def utf8_length(texts: list[str]) -> int:
    """The UTF-8 size of ``texts`` in bytes, encoded 64 Ki characters at a time (flat memory)."""
    n = 0
    for t in texts:
        if t.isascii():
            n += len(t)
        else:
            n += sum(len(t[i:i + 65536].encode("utf-8", "surrogatepass"))
                     for i in range(0, len(t), 65536))
    return n


def count_prompt_upto(
    doc: dict[str, Any],
    kind: Literal["chat", "completion"],
    limit: int | None,
    encoding: EncodingName = DEFAULT_ENCODING,
) -> PromptCount:
    """Prompt tokens of a request document of ``kind`` (the handler's endpoint kind), counting
    no further than needed to prove the prompt has more than ``limit`` tokens (None: count it
    all): before any encoding when its UTF-8 bytes alone prove it (``max_token_chars``), else as
    soon as the tokens counted plus the fewest the rest can hold pass ``limit``. So a prompt
    that cannot fit costs the encoding of about ``limit`` tokens (at most
    ``limit × max_token_chars`` characters), whatever its size. Texts are counted through
    ``BLOCKS`` (per prefix block), so each turn of a growing conversation encodes only what is
    new."""
    fixed, texts = _chat_parts(doc) if kind == "chat" else _completion_parts(doc)
    room = None if limit is None else limit - fixed
    if room is not None:  # a token is at most max_token_chars bytes: the bytes alone may prove it
        least = -(-utf8_length(texts) // max_token_chars(encoding))
        if least > room:
            return PromptCount(fixed + least, True)
    enc = get_encoding(encoding)

    def encode_len(text: str) -> int:
        return len(enc.encode_ordinary(text))

    n, stopped = BLOCKS.count_upto(encoding, texts, encode_len, room, max_token_chars(encoding))
    return PromptCount(fixed + n, stopped)


def count_chat_prompt(doc: dict[str, Any], encoding: EncodingName = DEFAULT_ENCODING) -> int:
    """Prompt tokens of a ``/v1/chat/completions`` request document (``messages``, ``tools``)
    by the cookbook rule (module docstring), all of them (``count_prompt_upto``)."""
    return count_prompt_upto(doc, "chat", None, encoding).tokens


def count_completion_prompt(doc: dict[str, Any], encoding: EncodingName = DEFAULT_ENCODING) -> int:
    """Prompt tokens of a ``/v1/completions`` request: ``prompt`` as a string, a list of
    strings, a list of token ids or a list of such lists (token ids count as given)."""
    return count_prompt_upto(doc, "completion", None, encoding).tokens


def count_prompt(
    doc: dict[str, Any],
    kind: Literal["chat", "completion"],
    encoding: EncodingName = DEFAULT_ENCODING,
) -> int:
    """Prompt tokens of a request document of ``kind`` (the handler's endpoint kind)."""
    return count_prompt_upto(doc, kind, None, encoding).tokens


async def count_prompt_async(
    doc: dict[str, Any],
    kind: Literal["chat", "completion"],
    *,
    size_hint: int,
    encoding: EncodingName = DEFAULT_ENCODING,
) -> int:
    """``count_prompt`` inline for small requests, in a worker thread when ``size_hint`` (the
    request body's length in bytes) exceeds ``OFFLOAD_CHARS``."""
    return (await count_prompt_upto_async(doc, kind, None, size_hint=size_hint,
                                          encoding=encoding)).tokens


async def count_prompt_upto_async(
    doc: dict[str, Any],
    kind: Literal["chat", "completion"],
    limit: int | None,
    *,
    size_hint: int,
    encoding: EncodingName = DEFAULT_ENCODING,
) -> PromptCount:
    """``count_prompt_upto`` inline for small requests, in a worker thread when ``size_hint``
    (the request body's length in bytes) exceeds ``OFFLOAD_CHARS``."""
    if size_hint > OFFLOAD_CHARS:
        return await asyncio.to_thread(count_prompt_upto, doc, kind, limit, encoding)
    return count_prompt_upto(doc, kind, limit, encoding)


async def count_text_async(text: str, encoding: EncodingName = DEFAULT_ENCODING) -> int:
    """``count_text`` inline for short text, in a worker thread above ``OFFLOAD_CHARS``."""
    if len(text) > OFFLOAD_CHARS:
        return await asyncio.to_thread(count_text, text, encoding)
    return count_text(text, encoding)


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
