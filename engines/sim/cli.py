"""Command line: ``python -m engines.sim [flags]`` / ``speedgate-sim [flags]``.

Flag names follow ``vllm serve`` where vLLM has the setting (``--max-model-len``,
``--max-num-seqs``, ``--max-num-batched-tokens``, ``--scheduling-policy``, ``--block-size``,
``--num-gpu-blocks-override`` as ``--num-gpu-blocks``, ``--served-model-name``,
``--num-speculative-tokens``, ``--enable-prompt-tokens-details``). Defaults and sources:
:mod:`engines.sim.config`, :mod:`engines.sim.perf`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from pydantic import ValidationError

from engines.sim.config import SimConfig
from engines.sim.faults import NO_FAULTS, Faults
from engines.sim.perf import PerfModel

DESCRIPTION = (
    "A vLLM-compatible engine simulator for CPU machines, tests and load tests: the OpenAI "
    "endpoints, /health, /metrics (vllm:* names), a continuous-batching performance model with "
    "prefix caching and speculative decoding, and scripted faults. Flag names follow "
    "`vllm serve`."
)
EPILOG = (
    "Model times are milliseconds at --time-scale 1 (Llama-3-70B on 4xH100, sources in "
    "engines/sim/perf.py); fault durations are wall-clock seconds and never scaled. "
    "Faults: --faults '{\"status\": 503, \"retry_after\": 2}', per request with the body "
    "field sim_faults, or POST /sim/faults (fields: engines/sim/faults.py)."
)


class _HelpWithDefaults(argparse.ArgumentDefaultsHelpFormatter):
    """Shows ``(default: ...)`` only where there is a default worth reading."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser, defaults taken from :class:`SimConfig` and :class:`PerfModel`;
    every numeric flag's help names its unit."""
    c, pm = SimConfig(), PerfModel()
    p = argparse.ArgumentParser(prog="speedgate-sim", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=_HelpWithDefaults)
    a = p.add_argument
    a("--host", default=c.host, help="address to listen on")
    a("--port", type=int, default=c.port, metavar="PORT",
      help="TCP port; 0 picks a free one (printed on the ready line)")
    a("--port-file", default=None, metavar="PATH",
      help="write the bound port to PATH once listening (use with --port 0)")
    a("--model", "--served-model-name", dest="model", default=c.model, help="served model name")
    a("--max-model-len", type=int, default=c.max_model_len, metavar="TOKENS",
      help="context length in tokens (prompt + output)")
    a("--max-num-seqs", type=int, default=c.max_num_seqs, metavar="N",
      help="running sequences per step (batch limit, in sequences)")
    a("--max-num-batched-tokens", type=int, default=c.max_num_batched_tokens, metavar="TOKENS",
      help="tokens per step (chunked-prefill budget)")
    a("--scheduling-policy", choices=["fcfs", "priority"], default=c.scheduling_policy,
      help="waiting queue order: fcfs, or by the request's priority field (lower first)")
    a("--block-size", type=int, default=c.block_size, metavar="TOKENS",
      help="tokens per KV-cache block")
    a("--num-gpu-blocks", type=int, default=c.num_gpu_blocks, metavar="BLOCKS",
      help="KV-cache size in blocks (x --block-size tokens)")
    a("--preemption", action="store_true",
      help="allocate decode KV blocks lazily and preempt the newest running request by "
      "recompute when they run out (vLLM V1); default: reserve prompt + output at admission")
    a("--kv-cache-tokens", type=int, default=None, metavar="TOKENS",
      help="KV-cache size in tokens (rounded down to whole blocks; overrides --num-gpu-blocks)")
    a("--output-tokens", type=int, default=c.output_tokens, metavar="TOKENS",
      help="natural completion length in tokens, when max_tokens allows it")
    a("--mode", choices=["standard", "speculative"], default="standard",
      help="speculative: the fast pool's engine (draft and verify steps)")
    a("--num-speculative-tokens", type=int, default=4, metavar="K",
      help="draft tokens per step (speculative mode)")
    a("--acceptance-rate", type=float, default=pm.acceptance_rate, metavar="ALPHA",
      help="probability that a draft token is accepted, 0..1")
    a("--prefill-ms-per-token", type=float, default=pm.prefill_ms_per_token, metavar="MS",
      help="prefill time in ms per uncached prompt token")
    a("--decode-base-ms", type=float, default=pm.decode_base_ms, metavar="MS",
      help="decode step time in ms, fixed part (streaming the weights once)")
    a("--decode-per-seq-ms", type=float, default=pm.decode_per_seq_ms, metavar="MS",
      help="decode step time in ms added per running sequence")
    a("--draft-base-ms", type=float, default=pm.draft_base_ms, metavar="MS",
      help="draft model step time in ms, fixed part (speculative mode)")
    a("--draft-per-seq-ms", type=float, default=pm.draft_per_seq_ms, metavar="MS",
      help="draft model step time in ms added per running sequence (speculative mode)")
    a("--time-scale", type=float, default=c.time_scale, metavar="FACTOR",
      help="multiplier of every model time; 0 = no model delay (fault delays are not scaled)")
    a("--seed", type=int, default=c.seed, metavar="N",
      help="random seed (an integer): same seed, same output")
    a("--enable-prompt-tokens-details", action=argparse.BooleanOptionalAction,
      default=c.enable_prompt_tokens_details,
      help="report usage.prompt_tokens_details.cached_tokens")
    a("--legacy-error-shape", action="store_true",
      help='errors as {"object": "error", ...} (older vLLM) instead of {"error": {...}}')
    a("--faults", default=None, metavar="JSON",
      help="fault script of this replica, a JSON object (fields: engines/sim/faults.py)")
    a("--accept-sim-faults", action="store_true",
      help="honour a request body's sim_faults field (tests, benchmarks); without it such a "
      "body is refused with 400, so clients cannot script or crash this replica")
    a("--slow-start-s", type=float, default=c.slow_start_s, metavar="SECONDS",
      help="seconds during which /health answers 503 after start")
    a("--crash", action="store_true", help="exit at the first request (the crash fault)")
    a("--after-tool-result", choices=["text", "call", "mix"], default=c.after_tool_result,
      help="the answer after a tool result: text (agent loops end), another call, or a "
      "seeded mix")
    a("--tool-arguments", choices=["required", "all"], default=c.tool_arguments,
      help="tool-call arguments fill the schema's required properties only, or all")
    return p


def kv_refusal(max_model_len: int, num_gpu_blocks: int, block_size: int) -> str | None:
    """vLLM's start-up refusal when one ``max_model_len`` sequence cannot fit the KV pool
    (``vllm/v1/core/kv_cache_utils.py`` ``_check_enough_kv_cache_memory``: a request takes
    ``cdiv(max_model_len, block_size)`` blocks), or None when it fits."""
    need = -(-max_model_len // block_size)
    if need <= num_gpu_blocks:
        return None
    return (f"To serve at least one request with the model's max seq len ({max_model_len}), "
            f"{need} KV cache blocks are needed, which is larger than the available KV cache "
            f"({num_gpu_blocks} blocks of {block_size} tokens). Based on the available memory, "
            f"the estimated maximum model length is {num_gpu_blocks * block_size}. Try "
            f"decreasing `max_model_len`.")


def parse_config(argv: Sequence[str] | None = None) -> SimConfig:
    """Parse ``argv`` into a :class:`SimConfig` (exits with a usage error on bad input)."""
    p = build_parser()
    ns = p.parse_args(argv)
    if not 0.0 <= ns.acceptance_rate <= 1.0:
        p.error("--acceptance-rate must be within 0..1")
    if ns.time_scale < 0:
        p.error("--time-scale must be >= 0")
    try:
        faults = Faults.model_validate_json(ns.faults) if ns.faults else NO_FAULTS
    except ValidationError as e:
        p.error(f"--faults: {e}")
    if ns.crash:
        faults = faults.merged(Faults(crash=True))
    if ns.block_size < 1:
        p.error("--block-size must be >= 1")
    if ns.kv_cache_tokens is not None:
        ns.num_gpu_blocks = ns.kv_cache_tokens // ns.block_size
    if (refusal := kv_refusal(ns.max_model_len, ns.num_gpu_blocks, ns.block_size)) is not None:
        p.error(refusal)
    k = ns.num_speculative_tokens if ns.mode == "speculative" else 0
    perf = PerfModel(
        prefill_ms_per_token=ns.prefill_ms_per_token,
        decode_base_ms=ns.decode_base_ms,
        decode_per_seq_ms=ns.decode_per_seq_ms,
        draft_base_ms=ns.draft_base_ms,
        draft_per_seq_ms=ns.draft_per_seq_ms,
        num_speculative_tokens=k,
        acceptance_rate=ns.acceptance_rate,
    )
    return SimConfig(
        host=ns.host, port=ns.port, port_file=ns.port_file, model=ns.model,
        max_model_len=ns.max_model_len,
        max_num_seqs=ns.max_num_seqs, max_num_batched_tokens=ns.max_num_batched_tokens,
        block_size=ns.block_size, num_gpu_blocks=ns.num_gpu_blocks,
        output_tokens=ns.output_tokens, time_scale=ns.time_scale, seed=ns.seed,
        scheduling_policy=ns.scheduling_policy, preemption=ns.preemption,
        enable_prompt_tokens_details=ns.enable_prompt_tokens_details,
        legacy_error_shape=ns.legacy_error_shape, slow_start_s=ns.slow_start_s,
        after_tool_result=ns.after_tool_result, tool_arguments=ns.tool_arguments,
        accept_sim_faults=ns.accept_sim_faults,
        perf=perf, faults=faults,
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``speedgate-sim`` and ``python -m engines.sim``."""
    from engines.sim.app import run

    run(parse_config(argv))
