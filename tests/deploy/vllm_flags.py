"""The `vllm serve` flags speedgate's launch profiles may use: each one checked by hand against
vLLM 0.32.0's argument definitions (EngineArgs in vllm/engine/arg_utils.py and the frontend args
in vllm/entrypoints/launchers/cli_args.py; speculative keys in vllm/config/speculative.py). vLLM
itself cannot be imported here, so this list is the typo guard: a new flag in a profile must be
checked against vLLM's source and added here."""

SERVE_FLAGS = frozenset({
    "config",
    "host",
    "port",
    "served-model-name",
    "tensor-parallel-size",
    "max-model-len",
    "kv-cache-dtype",
    "trust-remote-code",
    "enable-prefix-caching",
    "enable-prompt-tokens-details",
    "enable-chunked-prefill",
    "max-num-batched-tokens",
    "max-num-seqs",
    "gpu-memory-utilization",
    "disable-uvicorn-access-log",
    "speculative-config",
    "scheduling-policy",
})

SPECULATIVE_KEYS = frozenset({
    "method",
    "model",
    "num_speculative_tokens",
    "prompt_lookup_max",
    "prompt_lookup_min",
})
SPECULATIVE_METHODS = frozenset({"ngram", "eagle3"})
