"""Performance model of one vLLM replica: prefill, decode steps, speculative decoding.

Pure functions of the batch; no clocks, no I/O. All times are in **seconds** unless a name says
``_ms``. The scheduler loop (:mod:`engines.sim.engine`) asks this model how long each engine step
takes and how many tokens each running sequence gets from it.

Reference deployment: Llama-3-70B (bf16, ~141 GB of weights) with tensor parallelism 4 on H100
SXM class GPUs (3.35 TB/s HBM and ~989 dense bf16 TFLOPS each), the configuration of vLLM's own
benchmarks (vLLM blog, "vLLM v0.6.0: 2.7x Throughput Improvement and 5x Latency Reduction",
2024-09-05, https://blog.vllm.ai/2024/09/05/perf-update.html: Llama 70B on 4xH100, ShareGPT).

Standard decode, one token per running sequence per step::

    t_step(B) = decode_base_ms + decode_per_seq_ms * B

- ``decode_base_ms = 12``: a decode step streams all weights once. 141 GB / (4 x 3.35 TB/s)
  = 10.5 ms at full bandwidth, plus kernel-launch/all-reduce/scheduler overhead -> ~12 ms, i.e.
  ~80 tok/s for a single stream, which is the single-request TPOT range vLLM reports for 70B TP4.
- ``decode_per_seq_ms = 0.1``: the per-sequence compute of one token (2 x 70e9 FLOP = 140 GFLOP)
  on 4 x 989 TFLOPS at ~35 % MFU (~1.4 PFLOPS) is 0.1 ms, plus its KV-cache reads (320 KiB per
  token of context for Llama-3-70B: 2 x 80 layers x 8 KV heads x 128 x 2 B) which are small at
  1-2k context. At B = 256: 37.6 ms/step, ~6.8k output tok/s per replica.

Prefill (``prefill_ms_per_token = 0.07``): compute-bound at higher MFU (~50 %) than decode:
140 GFLOP / (4 x 989 TFLOPS x 0.5) = 0.07 ms per uncached prompt token (~14k prompt tok/s;
a 2k-token prompt -> ~140 ms TTFT), in line with the TTFTs of the vLLM v0.6.0 benchmark.

Speculative decoding (``k`` draft tokens, acceptance rate ``a``): each step drafts ``k`` tokens
with a small draft model, then the target verifies ``B x (k+1)`` tokens in one pass::

    t_spec(B) = k * (draft_base_ms + draft_per_seq_ms * B)          # draft model
              + decode_base_ms + decode_per_seq_ms * B * (k + 1)     # verification

and each sequence gets ``accepted + 1`` tokens, with expectation ``(1 - a^(k+1)) / (1 - a)``
(Leviathan, Kalman, Matias 2023, "Fast Inference from Transformers via Speculative Decoding",
eq. 1). Verification grows ``k+1`` times faster with the batch than a plain decode step, so the
gain shrinks and turns into a loss under load. Defaults ``k = 4``, ``a = 0.7`` (E = 2.77 tokens
per step), ``draft_base_ms = 1.0`` (a ~1B draft model is launch-bound), ``draft_per_seq_ms =
0.01`` give a 2.0x speedup at batch 1 and a 1.48x slowdown at batch 256, matching vLLM's
published measurements: up to 1.5x (ShareGPT, draft model) and 2.8x (CNN/DailyMail, n-gram)
speedup at low QPS, and a 1.4x / 1.8x slowdown at high QPS (vLLM blog, "How Speculative Decoding
Boosts vLLM Performance by up to 2.8x", 2024-10-17, https://blog.vllm.ai/2024/10/17/spec-decode.html;
vLLM docs, "Speculative Decoding": for "medium-to-low QPS, memory-bound workloads").
"""

from __future__ import annotations

import random
from dataclasses import dataclass

MS = 1e-3


def expected_tokens_per_step(k: int, a: float) -> float:
    """Expected tokens one sequence gains per speculative step: ``(1 - a^(k+1)) / (1 - a)``.

    ``k`` draft tokens, per-token acceptance probability ``a`` (Leviathan et al. 2023, eq. 1).
    ``k = 0`` is plain decoding (1 token); ``a = 1`` accepts everything (``k + 1`` tokens).
    """
    if k <= 0:
        return 1.0
    if a >= 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


@dataclass(frozen=True, slots=True)
class PerfModel:
    """Step-time model of one replica; see the module docstring for every constant's source.

    ``num_speculative_tokens = 0`` is the standard tier; ``> 0`` the speculative (fast) tier.
    """

    prefill_ms_per_token: float = 0.07
    decode_base_ms: float = 12.0
    decode_per_seq_ms: float = 0.1
    draft_base_ms: float = 1.0
    draft_per_seq_ms: float = 0.01
    num_speculative_tokens: int = 0
    acceptance_rate: float = 0.7

    @property
    def speculative(self) -> bool:
        """True when the replica runs speculative decoding."""
        return self.num_speculative_tokens > 0

    def prefill_s(self, tokens: int) -> float:
        """Seconds to prefill ``tokens`` uncached prompt tokens."""
        return tokens * self.prefill_ms_per_token * MS

    def decode_step_s(self, batch: int) -> float:
        """Seconds of one standard decode step with ``batch`` running sequences (0 when idle)."""
        if batch <= 0:
            return 0.0
        return (self.decode_base_ms + self.decode_per_seq_ms * batch) * MS

    def spec_step_s(self, batch: int) -> float:
        """Seconds of one speculative step (draft ``k`` tokens + verify ``B x (k+1)``)."""
        if batch <= 0:
            return 0.0
        k = self.num_speculative_tokens
        draft = k * (self.draft_base_ms + self.draft_per_seq_ms * batch)
        verify = self.decode_base_ms + self.decode_per_seq_ms * batch * (k + 1)
        return (draft + verify) * MS

    def step_s(self, batch: int) -> float:
        """Seconds of one decode step of this replica's kind."""
        return self.spec_step_s(batch) if self.speculative else self.decode_step_s(batch)

    def forward_s(self, batch: int, prefill_tokens: int) -> float:
        """Seconds of one engine step (one forward pass): ``batch`` decoding sequences plus
        ``prefill_tokens`` uncached prompt tokens (chunked prefill); 0 when there is nothing to
        run.

        Every forward pass streams the weights once, a prefill-only pass included: a step with
        no decoding sequence still costs ``decode_base_ms`` (the weight read of the module
        docstring) on top of its prefill compute, so a short prompt on an idle replica is
        memory-bound like a decode step (roofline: 100 prompt tokens are 7 ms of compute but
        10.5 ms of weight reads). Mixed steps pay the base once, inside ``step_s``.
        """
        if batch > 0:
            return self.step_s(batch) + self.prefill_s(prefill_tokens)
        if prefill_tokens <= 0:
            return 0.0
        return self.decode_base_ms * MS + self.prefill_s(prefill_tokens)

    def tokens_per_step(self) -> float:
        """Expected tokens per sequence per step (1 for standard decoding)."""
        return expected_tokens_per_step(self.num_speculative_tokens, self.acceptance_rate)

    def tpot_s(self, batch: int) -> float:
        """Expected time per output token (seconds) at a steady running batch of ``batch``."""
        return self.step_s(batch) / self.tokens_per_step()

    def speedup(self, batch: int) -> float:
        """Standard TPOT / this model's TPOT at ``batch`` (> 1: faster, < 1: slower)."""
        return self.decode_step_s(batch) / self.tpot_s(batch)

    def draw_accepted(self, rng: random.Random) -> int:
        """Draw the accepted draft tokens of one sequence for one step (0..k).

        Draft tokens are accepted left to right, each with probability ``a``, until the first
        rejection; the sequence then gains ``accepted + 1`` tokens (the target's own token).
        """
        k = self.num_speculative_tokens
        a = self.acceptance_rate
        accepted = 0
        rand = rng.random
        while accepted < k and rand() < a:
            accepted += 1
        return accepted
