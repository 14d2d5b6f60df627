#!/usr/bin/env bash
# Start one vLLM OpenAI server for a speedgate tier:   vllm-serve.sh standard|fast
#
# The one launcher behind every way speedgate runs vLLM (compose gpu profile, Kubernetes engine pods,
# local-pool.sh), so each tier gets the same flags everywhere. Static flags live in the profile YAML
# beside this script (standard.yaml, fast-$SPEC_METHOD.yaml); per-host values come from the
# environment and go on the command line, which vLLM gives precedence over the --config file.
#
# Environment:
#   MODEL              required: Hugging Face id or local path of the weights
#   SERVED_MODEL_NAME  name the gateway sends as `model` (its pool's served_model_name); default MODEL
#   PORT, HOST         listen address (default 0.0.0.0:8000)
#   TP                 tensor-parallel size = GPUs per replica (default 1)
#   SPEC_METHOD        fast tier's drafter: ngram (default) | eagle3 -> profile fast-$SPEC_METHOD.yaml
#   MAX_MODEL_LEN      context length; unset = the model's own (1M tokens needs the KV memory for it)
#   KV_CACHE_DTYPE     e.g. fp8: half the KV bytes per token, twice the prefix-cache capacity
#   VLLM_EXTRA_ARGS    more flags, split on spaces (e.g. "--trust-remote-code --tool-call-parser X")
#   VLLM_BIN           the vllm executable (default: vllm on PATH)
#   DRY_RUN=1          print the command instead of running it
set -euo pipefail

tier=${1:-}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
case "$tier" in
  standard) profile="$here/standard.yaml" ;;
  fast) profile="$here/fast-${SPEC_METHOD:-ngram}.yaml" ;;
  *) echo "usage: $0 standard|fast" >&2; exit 2 ;;
esac
if [ ! -f "$profile" ]; then
  echo "$0: no profile $profile (SPEC_METHOD=${SPEC_METHOD:-})" >&2
  exit 2
fi
: "${MODEL:?MODEL is required (Hugging Face id or local path)}"

args=(
  serve "$MODEL"
  --config "$profile"
  --served-model-name "${SERVED_MODEL_NAME:-$MODEL}"
  --host "${HOST:-0.0.0.0}"
  --port "${PORT:-8000}"
  --tensor-parallel-size "${TP:-1}"
)
if [ -n "${MAX_MODEL_LEN:-}" ]; then args+=(--max-model-len "$MAX_MODEL_LEN"); fi
if [ -n "${KV_CACHE_DTYPE:-}" ]; then args+=(--kv-cache-dtype "$KV_CACHE_DTYPE"); fi
if [ -n "${VLLM_EXTRA_ARGS:-}" ]; then
  read -r -a extra <<<"$VLLM_EXTRA_ARGS"
  args+=("${extra[@]}")
fi

if [ "${DRY_RUN:-0}" = 1 ]; then
  printf '%s\n' "${VLLM_BIN:-vllm}" "${args[@]}"
  exit 0
fi
exec "${VLLM_BIN:-vllm}" "${args[@]}"
