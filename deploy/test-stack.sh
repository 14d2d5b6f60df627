#!/usr/bin/env bash
# The compose `cpu` stack, for real: build the image, start the stack under Docker, check it as a
# user would, tear it down. Runs where no image registry is reachable and containers have no
# network (base images made locally: deploy/offline/base-images.sh).
#
#   deploy/test-stack.sh          # or: make stack-test (which also starts an engine if needed)
#   deploy/test-stack.sh down     # remove the stack an interrupted run left behind
#
# 1. local base images (cached): Debian bookworm + Python 3.11 as PYTHON_IMAGE, and Redis (the
#    usual image when it can be pulled, else Debian's redis-server);
# 2. the dependencies' wheels, downloaded on the host into .docker-wheels/ (cached by pyproject);
# 3. `docker build -t speedgate:local .`, the project's Dockerfile, with build arguments only;
# 4. `docker-compose -f deploy/compose.yaml up -d` (profile cpu: gateway, Redis, two simulated
#    replicas per tier), waiting for every healthcheck;
# 5. the official openai client against it (tests/deploy/stack_checks.py: both tiers, a stream,
#    usage, /metrics, /readyz), the gateway container's user (non-root), the gateway's state in
#    Redis (keys there; usage totals survive a gateway restart), then Redis stopped (the gateway
#    answers, /readyz degraded) and started again (/readyz ready);
# 6. `down --volumes` on exit, whatever happened, and a check that no container, network or
#    volume of the project is left.
#
# Exit 0 = passed, 77 = skipped (no Docker engine reachable; the reason on a SKIP line), else
# failed. Settings: STACK_PROJECT (compose project, default speedgate-stacktest), PYTHON (a Python
# with the dev extras, default .venv/bin/python), DOCKER (the docker CLI), STACK_READY_TIMEOUT (s).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-.venv/bin/python}
PROJECT=${STACK_PROJECT:-speedgate-stacktest}
READY_TIMEOUT=${STACK_READY_TIMEOUT:-240}
COMPOSE_FILE=deploy/compose.yaml
T0=$SECONDS
say() { printf '[stack %4ds] %s\n' "$((SECONDS - T0))" "$*"; }
fail() { say "FAIL: $*"; exit 1; }

# ---- tools -------------------------------------------------------------------------------
# A docker CLI that builds with BuildKit (the Dockerfile uses RUN --mount): one with the buildx
# plugin, or a classic one (< 23) whose built-in BuildKit DOCKER_BUILDKIT=1 turns on.
pick_docker() {
  local d v
  for d in ${DOCKER:-} docker /usr/bin/docker; do
    command -v "$d" >/dev/null 2>&1 || continue
    "$d" info >/dev/null 2>&1 || continue
    if "$d" buildx version >/dev/null 2>&1; then echo "$d"; return; fi
    v=$("$d" version --format '{{.Client.Version}}' 2>/dev/null || echo 0)
    if [ "${v%%.*}" -lt 23 ] 2>/dev/null; then echo "$d"; return; fi
  done
}
DOCKER=$(pick_docker)
if [ -z "$DOCKER" ]; then
  if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    echo "SKIP: docker stack test: the docker CLI has no BuildKit (install docker-buildx)"
  else
    echo "SKIP: docker stack test: no Docker engine reachable (deploy/offline/docker-engine.sh start)"
  fi
  exit 77
fi
export DOCKER DOCKER_BUILDKIT=1
if "$DOCKER" compose version >/dev/null 2>&1; then
  COMPOSE=("$DOCKER" compose)
elif command -v docker-compose >/dev/null 2>&1; then
  COMPOSE=(docker-compose)
else
  echo "SKIP: docker stack test: neither docker compose (v2) nor docker-compose is installed"
  exit 77
fi
[ -x "$PY" ] || fail "$PY missing: run make install"
compose() { "${COMPOSE[@]}" -f "$COMPOSE_FILE" "$@"; }
export COMPOSE_PROJECT_NAME=$PROJECT COMPOSE_PROFILES=cpu SPEEDGATE_IMAGE=speedgate:local
if [ "${1:-}" = down ]; then  # `deploy/test-stack.sh down`: remove what an interrupted run left
  compose down --volumes --remove-orphans --timeout 5
  exit
fi
say "engine $("$DOCKER" version --format '{{.Server.Version}}'), CLI $DOCKER, compose: ${COMPOSE[*]} $("${COMPOSE[@]}" version --short 2>/dev/null || true)"

# ---- 1. base images -------------------------------------------------------------------------
t=$SECONDS
images=$(deploy/offline/base-images.sh) || fail "base images (deploy/offline/base-images.sh)"
eval "$images"   # PYTHON_IMAGE=..., REDIS_IMAGE=...
say "base images ($((SECONDS - t)) s): PYTHON_IMAGE=$PYTHON_IMAGE REDIS_IMAGE=$REDIS_IMAGE"

# ---- 2. wheels ------------------------------------------------------------------------------
# The project's dependencies and its build backend (the image builds speedgate's own wheel from
# source with no index: PIP_NO_INDEX). Downloaded by this host's pip, but environment markers must
# be those of the image's interpreter (Debian's Python 3.11.2 needs async-timeout for redis-py,
# a newer 3.11 does not): the image's own pip, with no network, names what is still missing,
# and the host fetches it, until the image's pip resolves everything from the folder.
t=$SECONDS
WHEELS=.docker-wheels
key=$( (cat pyproject.toml; echo "$PYTHON_IMAGE") | sha256sum | cut -c1-16)
if [ "$(cat "$WHEELS/.key" 2>/dev/null)" != "$key" ]; then
  rm -rf "$WHEELS" && mkdir -p "$WHEELS"
  "$PY" -c 'import tomllib; d = tomllib.load(open("pyproject.toml", "rb"))
print("\n".join(d["project"]["dependencies"] + d["build-system"]["requires"]))' > "$WHEELS/requirements.txt"
  fetch=("${WHEELS}/requirements.txt")
  for round in 1 2 3 4 5 6; do
    nice -n 10 "$PY" -m pip wheel --quiet --disable-pip-version-check --wheel-dir "$WHEELS" \
      -r "${fetch[@]}" 2> >(grep -v "^WARNING: Location" >&2)
    missing=$("$DOCKER" run --rm --network none -v "$PWD/$WHEELS:/wheels:ro" "$PYTHON_IMAGE" \
      pip download --quiet --no-index --find-links /wheels --dest /tmp/resolved \
      -r /wheels/requirements.txt 2>&1 | sed -n 's/^ERROR: No matching distribution found for //p' \
      | cut -d';' -f1 || true)
    [ -z "$missing" ] && break
    [ "$round" -lt 6 ] || fail "wheels still missing for $PYTHON_IMAGE: $missing"
    say "the image's Python also needs: $(echo "$missing" | tr '\n' ' ')"
    printf '%s\n' "$missing" > "$WHEELS/extra-$round.txt"
    fetch=("$WHEELS/extra-$round.txt")
  done
  echo "$key" > "$WHEELS/.key"
fi
say "wheels ($((SECONDS - t)) s): $(find "$WHEELS" -name '*.whl' | wc -l) in $WHEELS/"

# ---- 3. image -------------------------------------------------------------------------------
t=$SECONDS
BUILD_LOG=${TMPDIR:-/tmp}/speedgate-stack-build.log
nice -n 10 "$DOCKER" build -t speedgate:local \
  --build-arg "PYTHON_IMAGE=$PYTHON_IMAGE" \
  --build-arg PIP_NO_INDEX=1 --build-arg "PIP_FIND_LINKS=/src/$WHEELS" . >"$BUILD_LOG" 2>&1 \
  || { tail -40 "$BUILD_LOG"; fail "docker build (log: $BUILD_LOG)"; }
BUILD_S=$((SECONDS - t))
SIZE_MB=$(( $("$DOCKER" image inspect -f '{{.Size}}' speedgate:local) / 1000000 ))
say "built speedgate:local in $BUILD_S s, image $SIZE_MB MB"

# ---- 4. the stack ---------------------------------------------------------------------------
# The README's cpu stack, with its own project name, the locally made Redis image, the gateway on
# a free loopback port (0: Docker picks one) and the simulator 5x faster than modelled speed.
export REDIS_IMAGE GATEWAY_BIND=127.0.0.1 GATEWAY_PORT=0 SIM_TIME_SCALE=0.2

leftovers() {
  local f="label=com.docker.compose.project=$PROJECT"
  echo "$("$DOCKER" ps -aq --filter "$f" | wc -l) containers," \
       "$("$DOCKER" network ls -q --filter "$f" | wc -l) networks," \
       "$("$DOCKER" volume ls -q --filter "$f" | wc -l) volumes"
}
teardown() {
  local rc=$?
  trap - EXIT INT TERM
  if [ "$rc" != 0 ]; then
    say "failed (exit $rc): last logs"
    compose logs --no-color --tail 30 2>&1 | tail -120 || true
  fi
  compose down --volumes --remove-orphans --timeout 10 >/dev/null 2>&1 || true
  local left
  left=$(leftovers)
  say "torn down: left $left"
  if [ "$left" != "0 containers, 0 networks, 0 volumes" ] && [ "$rc" = 0 ]; then rc=1; fi
  [ "$rc" = 0 ] && say "PASS: build ${BUILD_S}s, image ${SIZE_MB} MB, start-to-ready ${READY_S:-?}s, total $((SECONDS - T0))s"
  exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT TERM

# every container of the project healthy (each has a healthcheck), within READY_TIMEOUT
wait_healthy() {
  local end=$((SECONDS + READY_TIMEOUT)) ids states
  while :; do
    ids=$(compose ps -q)
    states=$(for id in $ids; do
      "$DOCKER" inspect -f '{{.Name}}={{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}' "$id"
    done)
    if [ -n "$ids" ] && ! grep -qv '=healthy$' <<<"$states"; then return 0; fi
    [ "$SECONDS" -lt "$end" ] || fail "not healthy after ${READY_TIMEOUT}s: $(tr '\n' ' ' <<<"$states")"
    sleep 2
  done
}

# the published gateway address (GATEWAY_PORT=0: a new port each time the container starts)
gateway_url() {
  local port
  port=$(compose port gateway-sim 8080)
  URL="http://${port/0.0.0.0/127.0.0.1}"
}

compose down --volumes --remove-orphans --timeout 5 >/dev/null 2>&1 || true  # an earlier run's
t=$SECONDS
compose up -d --no-build >/dev/null 2>&1 || { compose up -d --no-build; fail "compose up"; }
wait_healthy
gateway_url
READY_S=$((SECONDS - t))
say "stack healthy in ${READY_S} s (start-to-ready); gateway at $URL"

# ---- 5. checks ------------------------------------------------------------------------------
SESSION="stack-test-$(date +%s)-$$"  # the usage ledger is keyed by session: one per run
checks() { "$PY" -m tests.deploy.stack_checks "$URL" "$1" --session "$SESSION" | sed 's/^/    /'; }
checks api || fail "API checks"

gw=$(compose ps -q gateway-sim)
user=$("$DOCKER" inspect -f '{{.Config.User}}' "$gw")
uid=$("$DOCKER" exec "$gw" sh -c "awk '/^Uid:/ {print \$2}' /proc/1/status")
[ "$uid" != 0 ] && [ "$uid" = "${user%%:*}" ] || fail "gateway runs as uid $uid (image USER $user)"
say "gateway process (pid 1) runs as uid $uid, the image's non-root USER $user"

keys=$(compose exec -T redis redis-cli --scan --pattern 'speedgate:*' | sed 's/:[^:]*$//' | sort | uniq -c)
if ! grep -q 'speedgate:usage' <<<"$keys" || ! grep -q 'speedgate:route' <<<"$keys"; then
  fail "no gateway state in Redis: $keys"
fi
say "gateway state in Redis (keys by prefix): $(tr -s ' \n' ' ' <<<"$keys")"
compose restart gateway-sim >/dev/null 2>&1
wait_healthy
gateway_url
checks ledger || fail "usage totals lost across a gateway restart"
say "usage totals kept across a gateway restart (they live in Redis)"

compose stop redis >/dev/null 2>&1
checks degraded || fail "gateway with Redis stopped"
compose start redis >/dev/null 2>&1
wait_healthy
checks recovered || fail "gateway after Redis came back"
say "Redis stopped and started: gateway stayed up (degraded, then ready)"
