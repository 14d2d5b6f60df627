#!/usr/bin/env bash
# A Docker engine for deploy/test-stack.sh on a machine that may not have one running.
#
#   deploy/offline/docker-engine.sh start   # engine reachable (exit 0), or a SKIP line and exit 77
#   deploy/offline/docker-engine.sh stop    # stops the dockerd that `start` launched, if any
#
# `start` uses a running engine when `docker info` answers. Otherwise, as root (or with
# passwordless sudo), it installs Debian's docker.io (Docker 20.10), docker-compose (1.29) and
# mmdebstrap when absent and starts dockerd in the background, niced (builds load small hosts),
# with overlay2, or vfs where overlay2 cannot mount (some sandboxes). Its pid and log are kept in
# $SPEEDGATE_DOCKERD_DIR (/tmp/speedgate-dockerd) so that `stop` ends only that process.
set -euo pipefail

STATE=${SPEEDGATE_DOCKERD_DIR:-/tmp/speedgate-dockerd}
skip() { echo "SKIP: docker stack test: $*"; exit 77; }

SUDO=""
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo -n"; fi
fi

engine_up() {
  local d
  for d in docker /usr/bin/docker; do
    command -v "$d" >/dev/null 2>&1 && $SUDO "$d" info >/dev/null 2>&1 && return 0
  done
  return 1
}

start() {
  if engine_up; then
    if command -v docker-compose >/dev/null 2>&1 || docker compose version >/dev/null 2>&1; then
      return 0
    fi
  fi
  if [ "$(id -u)" != 0 ] && [ -z "$SUDO" ]; then
    engine_up && skip "no docker compose or docker-compose, and no root to install it"
    skip "no Docker engine running, and no root or passwordless sudo to start one"
  fi
  local missing=()
  command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
  command -v docker-compose >/dev/null 2>&1 || docker compose version >/dev/null 2>&1 \
    || missing+=(docker-compose)
  command -v mmdebstrap >/dev/null 2>&1 || missing+=(mmdebstrap)
  if [ ${#missing[@]} -gt 0 ]; then
    command -v apt-get >/dev/null 2>&1 || skip "no ${missing[*]} and no apt-get to install them"
    echo "[docker-engine] installing ${missing[*]} (Debian packages)" >&2
    { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
        $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null; } \
      || skip "apt-get install ${missing[*]} failed"
  fi
  engine_up && return 0
  $SUDO mkdir -p "$STATE"
  local driver
  for driver in overlay2 vfs; do
    echo "[docker-engine] starting dockerd (storage driver $driver; log $STATE/dockerd.log)" >&2
    $SUDO bash -c "nohup nice -n 10 dockerd --storage-driver=$driver \
      >'$STATE/dockerd.log' 2>&1 & echo \$! >'$STATE/dockerd.pid'"
    for _ in $(seq 60); do
      engine_up && { echo "[docker-engine] dockerd up ($driver)" >&2; return 0; }
      $SUDO kill -0 "$(cat "$STATE/dockerd.pid")" 2>/dev/null || break
      sleep 1
    done
    stop_daemon
    tail -5 "$STATE/dockerd.log" >&2 || true
  done
  skip "dockerd would not start (log: $STATE/dockerd.log)"
}

stop_daemon() {
  [ -f "$STATE/dockerd.pid" ] || return 0
  local pid
  pid=$(cat "$STATE/dockerd.pid")
  if $SUDO kill -0 "$pid" 2>/dev/null; then
    $SUDO kill -TERM "$pid"
    for _ in $(seq 30); do $SUDO kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  fi
  $SUDO rm -f "$STATE/dockerd.pid"
}

case "${1:-start}" in
  start) start ;;
  stop) stop_daemon ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
