# speedgate: the two commands a newcomer needs are `make demo` and `make test`; `make check` is
# the contributor's inner loop (docs/contributing.md says which target to run when).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip install --quiet --disable-pip-version-check
RUNTIME := $(VENV)/.installed-runtime
STAMP := $(VENV)/.installed-dev

.PHONY: install demo test check typecheck test-unit test-e2e test-integration test-vllm test-agents \
	test-clients test-deploy test-bench lint docs docs-serve bench bench-clients clean

# Installs into the venv with uv when it can be had (it resolves and downloads in parallel:
# ~4 s cold for the runtime here, against ~25 s for pip): the uv on PATH, else one that the
# host's pip puts into the venv (~3 s). Where uv cannot be had or fails, pip does it (ensurepip
# first). NO_UV=1 forces pip.
define venv_install
	uv=$$(command -v uv || echo $(BIN)/uv); \
	if [ -z "$(NO_UV)" ] && { [ -x "$$uv" ] || $(PYTHON) -m pip --python $(BIN)/python \
	    install --quiet --disable-pip-version-check uv; } && \
	    "$$uv" pip install --quiet --python $(BIN)/python $(1); then :; \
	else \
	  { [ -x $(BIN)/pip ] || $(BIN)/python -m ensurepip --default-pip >/dev/null; } && $(PIP) $(1); \
	fi
endef

# `make demo` needs only the runtime (and pip, for the `pip install openai` the demo suggests);
# `make test` and the rest add the dev and test extras.
# xds-protos (the picker's Envoy stubs) ships its own, older copy of OpenTelemetry's protos into
# the same opentelemetry/proto/ folder: whichever wheel installs last wins, and the older copy
# breaks the OTLP exporter (no InstrumentationScope). opentelemetry-proto reinstalled last wins;
# the newer protos are a superset of what the Envoy stubs import.
define otel_protos_last
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps \
	  "opentelemetry-proto==$$($(BIN)/python -c 'import importlib.metadata as m; print(m.version("opentelemetry-proto"))')"
endef

$(RUNTIME): pyproject.toml
	$(PYTHON) -m venv --without-pip $(VENV)
	$(call venv_install,-e . pip)
	$(otel_protos_last)
	touch $(RUNTIME)

$(STAMP): $(RUNTIME)
	$(call venv_install,-e '.[dev]')
	$(otel_protos_last)
	touch $(STAMP)

install: $(STAMP)  ## create .venv and install speedgate with its dev extras

# exec: speedgate replaces make's shell, so a SIGTERM that make forwards to its child reaches
# the demo itself, which stops the gateway and every simulator. Options (speedgate demo --help)
# pass through DEMO_ARGS: `make demo DEMO_ARGS="--max-model-len 128k --kv-size llama-3-8b:tp1"`
demo: $(RUNTIME)  ## simulated standard + fast pools and a gateway on http://127.0.0.1:8080
	exec $(BIN)/speedgate demo --port $${PORT:-8080} $(DEMO_ARGS)

test: $(STAMP)  ## lint, types, the docs site (strict: dead links fail), the whole test suite; starts Redis if needed
	$(BIN)/ruff check .
	$(BIN)/mypy gateway
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict
	bash tests/ensure-redis.sh
	$(BIN)/pytest -q

test-agents: $(STAMP)  ## Claude Code, Codex and OpenCode on scripted tasks through the demo (npm installs cached)
	$(BIN)/python -m tests.agents.install
	$(BIN)/pytest -q tests/agents

docs: $(STAMP)  ## build the documentation site into build/site (strict: dead links fail)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: $(STAMP)  ## serve the documentation site on http://127.0.0.1:8000, rebuilt on edits
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

# The tiers below split `make test`'s suite by what a test starts: check (no process stacks, on
# two workers, under a minute), unit (check's tests plus the slow ones), e2e (simulator replicas
# and gateways as processes), integration (real vLLM, agents, client SDKs, deployment files)
# and the benchmarks' own tests (short runs of each benchmark).
check: $(STAMP)  ## inner loop, under a minute: ruff, mypy, unit and architecture tests (no slow ones)
	bash tests/ensure-redis.sh
	$(BIN)/ruff check .
	$(BIN)/mypy gateway
	$(BIN)/pytest -q -n 2 -m "not slow" tests/unit tests/architecture

typecheck: $(STAMP)  ## mypy gateway (configured under [tool.mypy] in pyproject.toml)
	$(BIN)/mypy gateway

test-unit: $(STAMP)  ## unit and architecture tests, the slow ones included (fuzzing, real timeouts)
	bash tests/ensure-redis.sh
	$(BIN)/pytest -q tests/unit tests/architecture

test-e2e: $(STAMP)  ## simulator replicas and gateways as real processes (Envoy, chaos, browser)
	bash tests/ensure-redis.sh
	$(BIN)/pytest -q tests/e2e tests/engines tests/ci

test-integration: test-vllm test-agents test-clients test-deploy  ## every integration target below

test-vllm: $(STAMP)  ## CPU vLLM with a tiny local model behind a gateway (skipped without vLLM)
	$(BIN)/pytest -q tests/integration_vllm

test-clients: $(STAMP)  ## the official Python and Node SDKs and agent frameworks through a gateway
	$(BIN)/pytest -q tests/clients

test-deploy: $(STAMP)  ## Dockerfile, compose and Kubernetes files, packaging, the stack scripts
	$(BIN)/pytest -q tests/deploy

test-bench: $(STAMP)  ## each benchmark (loadtests/) on a short run, its report and its targets
	bash tests/ensure-redis.sh
	$(BIN)/pytest -q tests/loadtests

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)  ## gateway overhead vs direct-to-engine (prints a table)
	$(BIN)/python -m loadtests.bench_overhead

bench-clients: $(STAMP)  ## aiohttp vs httpx as the upstream client
	$(BIN)/python -m loadtests.bench_http_clients

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .mypy_cache

.PHONY: loadtest race capacity capacity-core relay-events step-budget bench-long
loadtest: $(STAMP)  ## locust on the CPU stack -> reports/loadtest-<time>/summary.md + plots (ARGS=...)
	$(BIN)/python -m loadtests.run_loadtest $(ARGS)

race: $(STAMP)  ## direct vs speedgate vs LiteLLM proxy (installs LiteLLM into loadtests/.venv-litellm)
	$(BIN)/python -m loadtests.bench_race $(ARGS)

capacity: $(STAMP)  ## concurrent slow streams one gateway process holds, memory per stream
	$(BIN)/python -m loadtests.bench_capacity $(ARGS)

capacity-core: $(STAMP)  ## req/s, latency, CPU and RSS per gateway core vs a raw engine (ARGS=--base DIR ...)
	$(BIN)/python -m loadtests.bench_capacity_core $(ARGS)

relay-events: $(STAMP)  ## gateway CPU per relayed event, tokens arriving one by one (ARGS=--base DIR ...)
	$(BIN)/python -m loadtests.bench_relay_events $(ARGS)

step-budget: $(STAMP)  ## gateway CPU per request and per event by step (py-spy) vs the floor (ARGS=--base DIR ...)
	$(BIN)/python -m loadtests.bench_step_budget $(ARGS)

bench-long: $(STAMP)  ## a growing 1M-token agent session beside small requests: direct, floor, speedgate, smg (installs smg into loadtests/.venv-smg; ARGS=...)
	$(BIN)/python -m loadtests.bench_long_prompts $(ARGS)

.PHONY: bench-flow
bench-flow: $(STAMP)  ## flow control: interactive TTFT under a batch-agent flood, off vs on (ARGS=...)
	$(BIN)/python -m loadtests.bench_flow_control --plot docs/img/bench_flow_control.png $(ARGS)

.PHONY: stack-test
stack-test: $(STAMP)  ## build the image, run the compose cpu stack under Docker, check it (deploy/test-stack.sh)
	bash deploy/offline/ci-stack.sh
