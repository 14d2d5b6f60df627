#!/usr/bin/env bash
# Run a local two-tier vLLM pool on one GPU host, without Docker.
#
#   MODEL=Qwen/Qwen3-8B engines/profiles/local-pool.sh start    # replicas up, healthy, config written
#   speedgate serve -c .local-pool/gateway.yaml                 # the gateway in front of them
#   engines/profiles/local-pool.sh status | stop
#
# Each replica is `vllm-serve.sh TIER` on its own GPUs (TP consecutive ids from GPUS) and port, in
# its own session (process group), so `stop` also ends vLLM's worker processes. Logs and pid files
# go to RUN_DIR; `start` waits for every /health, then writes RUN_DIR/gateway.yaml for the gateway.
#
# Environment (besides vllm-serve.sh's MODEL, SERVED_MODEL_NAME, SPEC_METHOD, MAX_MODEL_LEN, ...):
#   STANDARD_REPLICAS, FAST_REPLICAS   replicas per tier (default 1 and 1)
#   TP                                 GPUs per replica (default 1)
#   GPUS                               GPU ids to use, comma-separated (default: all, from nvidia-smi)
#   STANDARD_PORT, FAST_PORT           first port of each tier (default 8001, 8101)
#   LISTEN_HOST                        replicas' listen address (default 127.0.0.1; 0.0.0.0 for
#                                      a gateway on another host)
#   RUN_DIR                            logs, pids, gateway.yaml (default ./.local-pool)
#   HEALTH_TIMEOUT_S                   how long a replica may take to load (default 1800)
#   GATEWAY_MODEL                      client-facing model name in gateway.yaml (default mymodel)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
run_dir=${RUN_DIR:-./.local-pool}
cmd=${1:-}

replica_pids() { cat "$run_dir"/*.pid 2>/dev/null || true; }

stop_all() {
  local pids pid
  pids=$(replica_pids)
  for pid in $pids; do kill -TERM -- "-$pid" 2>/dev/null || true; done
  for _ in $(seq 1 100); do  # vLLM frees GPU memory on SIGTERM; give it 10 s
    local alive=0
    for pid in $pids; do kill -0 -- "-$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for pid in $pids; do kill -KILL -- "-$pid" 2>/dev/null || true; done
  rm -f "$run_dir"/*.pid
}

healthy() {  # healthy URL -> 0 when GET URL/health answers 200
  python3 - "$1" <<'EOF'
import sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1] + "/health", timeout=2) as r:
        sys.exit(0 if r.status == 200 else 1)
except OSError:
    sys.exit(1)
EOF
}

write_gateway_config() {  # write_gateway_config "STANDARD_URLS" "FAST_URLS" (space-separated)
  local name=${SERVED_MODEL_NAME:-$MODEL} model=${GATEWAY_MODEL:-mymodel} tier list u
  {
    echo "# written by engines/profiles/local-pool.sh; serve with: speedgate serve -c $run_dir/gateway.yaml"
    echo "server: {host: 127.0.0.1, port: 8080}"
    echo "models:"
    echo "  $model:"
    echo "    aliases: {$model-fast: fast, $model-standard: standard, $model-auto: auto}"
    echo "    fallback: {fast: standard}"
    echo "    tiers:"
    for tier in standard fast; do
      list=$1
      if [ "$tier" = fast ]; then list=$2; fi
      echo "      $tier:"
      echo "        served_model_name: \"$name\""
      echo "        endpoints:"
      for u in $list; do echo "          - $u"; done
    done
  } >"$run_dir/gateway.yaml"
}

start_all() {
  : "${MODEL:?MODEL is required}"
  local tp=${TP:-1} ns=${STANDARD_REPLICAS:-1} nf=${FAST_REPLICAS:-1}
  local gpus
  if [ -n "${GPUS:-}" ]; then
    IFS=, read -r -a gpus <<<"$GPUS"
  else
    mapfile -t gpus < <(nvidia-smi --query-gpu=index --format=csv,noheader)
  fi
  local need=$(((ns + nf) * tp))
  if [ "${#gpus[@]}" -lt "$need" ]; then
    echo "$0: $ns+$nf replicas x TP=$tp need $need GPUs, have ${#gpus[@]} (${gpus[*]:-none})" >&2
    exit 2
  fi
  if [ -n "$(replica_pids)" ]; then
    echo "$0: a pool is already running from $run_dir (stop it first)" >&2
    exit 2
  fi
  mkdir -p "$run_dir"
  local standard_urls="" fast_urls=""
  local next=0 tier i port devs urls=()
  for tier in standard fast; do
    local n=$ns base=${STANDARD_PORT:-8001}
    if [ "$tier" = fast ]; then n=$nf base=${FAST_PORT:-8101}; fi
    for ((i = 0; i < n; i++)); do
      port=$((base + i))
      devs=$(IFS=,; echo "${gpus[*]:next:tp}")
      next=$((next + tp))
      # setsid: its own process group, so stop_all can signal vLLM and all its workers at once
      CUDA_VISIBLE_DEVICES=$devs PORT=$port HOST=${LISTEN_HOST:-127.0.0.1} TP=$tp \
        setsid bash "$here/vllm-serve.sh" "$tier" >"$run_dir/$tier-$i.log" 2>&1 &
      echo $! >"$run_dir/$tier-$i.pid"
      urls+=("http://127.0.0.1:$port")
      if [ "$tier" = standard ]; then standard_urls+=" http://127.0.0.1:$port"
      else fast_urls+=" http://127.0.0.1:$port"; fi
      echo "started $tier replica $i on GPU(s) $devs, port $port (log $run_dir/$tier-$i.log)"
    done
  done
  local deadline=$((SECONDS + ${HEALTH_TIMEOUT_S:-1800})) u
  for u in "${urls[@]}"; do
    until healthy "$u"; do
      if [ "$SECONDS" -ge "$deadline" ]; then
        echo "$0: $u not healthy in time; stopping the pool (see $run_dir/*.log)" >&2
        stop_all
        exit 1
      fi
      for pidfile in "$run_dir"/*.pid; do
        if ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
          echo "$0: replica ${pidfile%.pid} exited; stopping the pool (log ${pidfile%.pid}.log)" >&2
          stop_all
          exit 1
        fi
      done
      sleep 1
    done
    echo "healthy: $u"
  done
  write_gateway_config "$standard_urls" "$fast_urls"
  echo "pool ready; gateway config: $run_dir/gateway.yaml"
  echo "  speedgate serve -c $run_dir/gateway.yaml"
}

case "$cmd" in
  start) start_all ;;
  stop) stop_all; echo "pool stopped" ;;
  status)
    for pidfile in "$run_dir"/*.pid; do
      [ -e "$pidfile" ] || { echo "no pool running from $run_dir"; exit 0; }
      state=running; kill -0 "$(cat "$pidfile")" 2>/dev/null || state=exited
      echo "$(basename "${pidfile%.pid}"): pid $(cat "$pidfile") $state"
    done ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
