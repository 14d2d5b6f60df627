#!/usr/bin/env bash
# Local base images for building and running the compose stack where no image registry can be
# reached (and containers have no network): a Debian bookworm root filesystem with Python 3.11,
# made on this host from Debian's package mirror (mmdebstrap) and loaded with `docker import`,
# and, when `redis:7` cannot be pulled, a Redis image made the same way from Debian's redis-server.
#
#   deploy/offline/base-images.sh          # prints PYTHON_IMAGE=... and REDIS_IMAGE=... lines
#
# The root filesystems are cached in $SPEEDGATE_CACHE (~/.cache/speedgate/docker), keyed by a hash
# of what goes into them; an image already in the engine is reused. Needs root (mmdebstrap runs
# package scripts in a chroot) and a reachable Debian mirror ($DEBIAN_MIRROR).
set -euo pipefail
shopt -s inherit_errexit  # a failed import or build inside $(image ...) stops the script

DOCKER=${DOCKER:-docker}
CACHE=${SPEEDGATE_CACHE:-$HOME/.cache/speedgate/docker}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
SUITE=bookworm
NICE=(nice -n 10)
mkdir -p "$CACHE"

# Package lists. The Python base stands in for python:3.11-slim-bookworm: `python` and `pip` on
# PATH, and pip allowed to install into the system interpreter (the official image's Python is
# not Debian-managed, so the Dockerfile's `pip install` must work here too).
PY_PACKAGES="python3,python3-pip,python-is-python3,ca-certificates,passwd"
REDIS_PACKAGES="redis-server"

log() { echo "[base-images] $*" >&2; }

# rootfs NAME PACKAGES -> path of a cached tarball (built when absent)
rootfs() {
  local name=$1 packages=$2
  local key
  key=$(printf '%s\n' "$SUITE" "$MIRROR" "$packages" | sha256sum | cut -c1-12)
  local tar="$CACHE/$name-$SUITE-$key.tar"
  if [ ! -s "$tar" ]; then
    command -v mmdebstrap >/dev/null || { log "mmdebstrap is missing (apt-get install mmdebstrap)"; exit 3; }
    log "building the $name root filesystem from $MIRROR (cached as $tar)"
    local t0=$SECONDS
    "${NICE[@]}" mmdebstrap --quiet --variant=minbase --mode=root --format=tar \
      --aptopt='APT::Install-Recommends "false"' \
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
      --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
      --include="$packages" "$SUITE" "$tar.tmp" \
      "deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" \
      "deb $SECURITY $SUITE-security main" >&2
    mv "$tar.tmp" "$tar"
    log "$name root filesystem: $((SECONDS - t0)) s"
  fi
  echo "$tar"
}

# image TAG TARBALL [DOCKERFILE-LINES]: `docker import` TARBALL, then, on top of it, a build of
# the given Dockerfile lines (no network needed: they only edit files and set metadata); skipped
# when the engine already has TAG.
image() {
  local tag=$1 tar=$2 lines=${3:-}
  if "$DOCKER" image inspect "$tag" >/dev/null 2>&1; then echo "$tag"; return; fi
  log "importing $tag"
  "$DOCKER" import "$tar" "$tag-rootfs" >/dev/null
  printf 'FROM %s\n%s\n' "$tag-rootfs" "$lines" | "$DOCKER" build --quiet -t "$tag" - >/dev/null
  "$DOCKER" rmi "$tag-rootfs" >/dev/null
  echo "$tag"
}

# tag NAME TARBALL LINES: NAME plus a hash of what makes the image (root filesystem and lines)
tag() {
  echo "$1-$( (basename "$2"; printf '%s' "$3") | sha256sum | cut -c1-12)"
}

# ---- Python base (PYTHON_IMAGE of the Dockerfile) ------------------------------------------
py_tar=$(rootfs python "$PY_PACKAGES")
# Debian marks its Python externally managed (PEP 668); the official image's is not, and the
# Dockerfile's `pip install` into it is the point of the image.
py_lines='RUN rm -f /usr/lib/python3*/EXTERNALLY-MANAGED
ENV LANG=C.UTF-8
CMD ["python3"]'
echo "PYTHON_IMAGE=$(image "$(tag speedgate-base/python:3.11-bookworm "$py_tar" "$py_lines")" \
  "$py_tar" "$py_lines")"

# ---- Redis: the usual image when the engine has it or can pull it, else a local one ----------
want=${REDIS_IMAGE:-redis:7.4-alpine}
if "$DOCKER" image inspect "$want" >/dev/null 2>&1 \
   || timeout 60 "$DOCKER" pull -q "$want" >/dev/null 2>&1; then
  echo "REDIS_IMAGE=$want"
else
  log "$want cannot be pulled: using Debian's redis-server"
  redis_tar=$(rootfs redis "$REDIS_PACKAGES")
  # The package's own `redis` system user; /var/lib/redis is its working directory.
  redis_lines='USER redis
WORKDIR /var/lib/redis
CMD ["redis-server"]'
  echo "REDIS_IMAGE=$(image "$(tag speedgate-base/redis:7-bookworm "$redis_tar" "$redis_lines")" \
    "$redis_tar" "$redis_lines")"
fi
