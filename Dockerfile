# The speedgate gateway image (also carries the engine simulator, `speedgate-sim`, for CPU stacks).
#
#   docker build -t speedgate:local .
#   docker run --rm -p 8080:8080 -v $PWD/my.yaml:/etc/speedgate/speedgate.yaml:ro speedgate:local
#
# Config: mount a YAML file at /etc/speedgate/speedgate.yaml (or pass --config PATH), and override
# any field with SPEEDGATE_<SECTION>__<FIELD> environment variables (they win over file and flags).
#
# Needs BuildKit (Docker 23+ by default; DOCKER_BUILDKIT=1 on 20.10) for RUN --mount. No
# `# syntax=` line on purpose: it would make BuildKit fetch a frontend image from Docker Hub, and
# the built-in frontend has everything used here, so the build works with no registry at all.
# With no registry or network (deploy/test-stack.sh, `make stack-test`) only build arguments differ:
#   PYTHON_IMAGE  a local Debian bookworm image with python3 and pip (deploy/offline/base-images.sh)
#   PIP_NO_INDEX=1 PIP_FIND_LINKS=/src/.docker-wheels   wheels downloaded on the host beforehand

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- build: wheels for speedgate and every dependency, from pyproject.toml --------------------
FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
# pip reads these from the environment; unset (the default) = the package index as usual.
ARG PIP_NO_INDEX
ARG PIP_FIND_LINKS
# .dockerignore lets in only pyproject.toml, README.md and the two packages.
COPY . .
# One wheel per distribution in /wheels; the runtime stage installs from there with no index, so
# it needs no compiler and no network, and gets exactly what was resolved here.
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

# ---- runtime ----------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# The project's own wheel by file name (hence pinned), its dependencies from the same folder;
# then opentelemetry-proto again: xds-protos ships an older copy of OpenTelemetry's protos into
# the same folder and the OTLP exporter needs its own (a superset of what Envoy's stubs import).
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels /wheels/speedgate-*.whl \
    && pip install --no-cache-dir --no-index --force-reinstall --no-deps \
       /wheels/opentelemetry_proto-*.whl
# Numeric uid/gid: Kubernetes' runAsNonRoot can only verify a numeric user.
RUN groupadd --system --gid 10001 speedgate \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin speedgate
USER 10001:10001
EXPOSE 8080
# /healthz answers while the process serves (liveness); /readyz is for load balancers.
# SPEEDGATE_SERVER__PORT, when set, overrides the port, so the probe follows it.
# Timeout and start period sized for a busy small host (2 shared cores, several containers
# starting at once): a Python probe alone can take seconds there, and the gateway's import ~20 s.
HEALTHCHECK --interval=10s --timeout=10s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; u.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('SPEEDGATE_SERVER__PORT', '8080'), timeout=8)"]
# One uvicorn worker (server.workers: 1): the gateway is async and each worker would route with its
# own in-flight counts and affinity table; scale with more containers. SPEEDGATE_SERVER__WORKERS
# raises it where one process is all a host gets.
ENTRYPOINT ["speedgate", "serve"]
CMD ["--config", "/etc/speedgate/speedgate.yaml", "--host", "0.0.0.0", "--port", "8080"]
