"""The engine's own token count of a text, for a continuation's output limit.

A continuation asks for the client's ``max_tokens`` less the tokens the broken attempts
produced. The broken engine never reported its count, and the gateway's tokenizer (tiktoken)
is not the model's: its estimate can be off by a token per word, which cut a length-limited
answer a word short (or would let it run past the limit). So the continuation first asks a
replica of the pool that will continue the text for its count: vLLM's ``POST /tokenize``
(``vllm/entrypoints/serve/tokenize``: ``{"model", "prompt", "add_special_tokens"}`` ->
``{"count", ...}``), once per carried text, within ``TOKENIZE_TIMEOUT_S``. An engine without
the endpoint, an error or the timeout leave the estimate in force.
"""

from __future__ import annotations

import asyncio

import orjson

from gateway.upstream.client import (
    UpstreamBrokenError,
    UpstreamConnectError,
    UpstreamUnreadable,
)
from gateway.upstream.transport import UpstreamClient

TOKENIZE_TIMEOUT_S = 2.0  # at most, per continuation (seconds); bounded by the deadline too


async def engine_token_count(
    upstream: UpstreamClient, replica_url: str, served_model: str, texts: tuple[str, ...],
    timeout_s: float,
) -> int | None:
    """The replica's token count of each non-empty text of ``texts``, summed (no special
    tokens added), or None when it did not give one within ``timeout_s`` seconds (no
    ``/tokenize``, a non-200 answer, a body without an integer ``count``, a failure)."""
    total = 0
    try:
        async with asyncio.timeout(max(0.001, timeout_s)):
            for text in texts:
                if not text:
                    continue
                body = orjson.dumps({"model": served_model, "prompt": text,
                                     "add_special_tokens": False})
                resp = await upstream.post(replica_url + "/tokenize", body,
                                           {"content-type": "application/json"}, timeout_s)
                try:
                    raw = await resp.read(None if resp.status == 200 else 1024)
                finally:
                    resp.close()
                if resp.status != 200:
                    return None
                count = orjson.loads(raw).get("count") if raw[:1] == b"{" else None
                if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                    return None
                total += count
    except (TimeoutError, UpstreamConnectError, UpstreamBrokenError, UpstreamUnreadable,
            orjson.JSONDecodeError):
        return None
    return total
