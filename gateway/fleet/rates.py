"""A pool's measured prefill and decode rates, for weighing a move against a wait when a
session's replica has no KV room (``gateway.routing.kv_placement``).

``prefill_tok_s``: uncached prompt tokens per second of time to first token (``usage.prompt −
usage.cached`` over ``ttft_s``: the engine's queue and scheduling included, which a move pays
too). ``decode_tok_s``: output tokens per second of one sequence after its first token
(``(completion − 1) / decode_s``, ``decode_s`` the stream's first to last content event: the
caller's, ``gateway.account``, which feeds completed streams only). Both are exponentially
weighted moving averages (``alpha`` 0.2: the last ~10 requests weigh most) of requests with
enough tokens to say something (``MIN_PREFILL_TOKENS``, ``MIN_DECODE_TOKENS``). Until measured,
the defaults: ``DEFAULT_PREFILL_TOK_S`` = 5,000 tokens/s (the order of one vLLM replica of a
70B-class model on 8 H100/H200, whose prefill runs at ~5-15k tokens/s: vLLM's published
benchmark ``benchmarks/benchmark_serving.py`` results) and ``DEFAULT_DECODE_TOK_S`` = 30
tokens/s per sequence (a batched 70B decode step of ~30 ms, same source).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeGuard

DEFAULT_PREFILL_TOK_S = 5_000.0
DEFAULT_DECODE_TOK_S = 30.0
MIN_PREFILL_TOKENS = 256
MIN_DECODE_TOKENS = 16
ALPHA = 0.2


@dataclass(slots=True)
class PoolRates:
    """Measured (or default) rates of one pool: ``prefill_tok_s`` and ``decode_tok_s`` (per
    sequence), tokens per second; ``prefill_samples``/``decode_samples`` how many fed them."""

    prefill_tok_s: float = DEFAULT_PREFILL_TOK_S
    decode_tok_s: float = DEFAULT_DECODE_TOK_S
    prefill_samples: int = 0
    decode_samples: int = 0

    def observe(
        self, prompt: int, cached: int, completion: int, ttft_s: float | None,
        decode_s: float | None,
    ) -> None:
        """Feed one served stream: its usage (tokens), time to first token and decode time
        (seconds from its first to its last content event). Requests too small to measure a
        rate, without a TTFT or decode time, or with a time that is not a finite positive
        number (NaN, inf, 0: a rate of it would be NaN or infinite and poison every later
        average), are ignored for that rate."""
        if _positive(ttft_s) and prompt - cached >= MIN_PREFILL_TOKENS:
            self.prefill_tok_s = self._ewma(self.prefill_tok_s, (prompt - cached) / ttft_s,
                                            self.prefill_samples)
            self.prefill_samples += 1
        if _positive(decode_s) and completion >= MIN_DECODE_TOKENS:
            self.decode_tok_s = self._ewma(self.decode_tok_s, (completion - 1) / decode_s,
                                           self.decode_samples)
            self.decode_samples += 1

    @staticmethod
    def _ewma(old: float, new: float, samples: int) -> float:
        return new if samples == 0 else old + ALPHA * (new - old)  # the first replaces the default


def _positive(v: float | None) -> TypeGuard[float]:
    """True for a finite number above 0."""
    return v is not None and math.isfinite(v) and v > 0
