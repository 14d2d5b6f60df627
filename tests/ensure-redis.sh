#!/usr/bin/env bash
# Start the local Redis the tests use (127.0.0.1:6379, no persistence) unless one answers.
# Same command as the machine's own service start; used by `make test` and .ci/run.
set -u
if (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null; then
  exit 0
fi
if ! command -v redis-server >/dev/null; then
  echo "tests need Redis on 127.0.0.1:6379 and redis-server is not installed" >&2
  echo "(Debian/Ubuntu: apt-get install -y redis-server)" >&2
  exit 1
fi
mkdir -p /tmp/speedgate-redis
redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
  --dir /tmp/speedgate-redis --logfile /tmp/speedgate-redis/redis.log
for _ in $(seq 50); do
  (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null && exit 0
  sleep 0.1
done
echo "redis-server did not come up on 127.0.0.1:6379" >&2
exit 1
