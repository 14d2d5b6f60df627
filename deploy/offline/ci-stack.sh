#!/usr/bin/env bash
# CI entry of the Docker stack test (`make stack-test`, .ci/run): a Docker engine started if
# needed (deploy/offline/docker-engine.sh), deploy/test-stack.sh bounded in time, then the stack
# and any dockerd started here stopped again.
#
# Exit 0 = passed or skipped (a `SKIP: ...` line says why: no engine can be had here), 1 = failed
# or ran past STACK_TIME_LIMIT seconds (default 600: measured 5 min 21 s cold with a warm pip
# cache, ~1 min with cached images; the margin is for a slow package mirror on a fresh machine).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
LIMIT=${STACK_TIME_LIMIT:-600}

rc=0
bash deploy/offline/docker-engine.sh start || rc=$?
if [ "$rc" = 0 ]; then
  timeout --kill-after=30 "$LIMIT" bash deploy/test-stack.sh || rc=$?
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    echo "FAIL: docker stack test ran past ${LIMIT}s"
    bash deploy/test-stack.sh down || true
  fi
fi
bash deploy/offline/docker-engine.sh stop || true
case "$rc" in
  0) exit 0 ;;
  77) echo "(docker stack test skipped, see the SKIP line above)"; exit 0 ;;
  *) exit 1 ;;
esac
