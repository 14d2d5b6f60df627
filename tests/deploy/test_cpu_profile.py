"""The compose `cpu` profile's own commands, run here as processes: the profile's wiring works.

Each engine service runs exactly its compose argv (image entrypoint + command); the gateway runs
the Dockerfile's ENTRYPOINT with the service's command and environment, on the config file the
service mounts. Two things differ, because the services share this host instead of a network:
every listening port is replaced by port 0 (each server reports the port it bound), and every
service name in the gateway config by 127.0.0.1 (the port map keeps each endpoint pointing at
its own service). The `redis` service is the tests' local Redis (127.0.0.1:6379,
tests/ensure-redis.sh), which the gateway's ``state.redis_url`` is pointed at.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import redis
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gateway.telemetry.usage_store import RedisUsageStore
from tests import promql
from tests.deploy import composefile as cf
from tests.deploy import dockerfile as df
from tests.deploy import stack_checks
from tests.deploy.processes import start_on_port0, stop_processes, wait_http
from tests.deploy.tools import BIN, DEPLOY

CONFIG_IN_CONTAINER = "/etc/speedgate/speedgate.yaml"
REDIS_PORT = 6379  # in the compose network and on this host (tests/ensure-redis.sh)


def _exe(name: str) -> str:
    """An image's executable, from this venv (the image installs the same console scripts)."""
    path = BIN / name
    assert path.exists(), f"{name} is not a console script of this project"
    return str(path)


def _retarget(argv: list[str], port: int, config: Path | None = None) -> list[str]:
    out = list(argv)
    out[out.index("--port") + 1] = str(port)
    out[out.index("--host") + 1] = "127.0.0.1"
    if config is not None:
        assert out[out.index("--config") + 1] == CONFIG_IN_CONTAINER
        out[out.index("--config") + 1] = str(config)
    return out


class CpuStack:
    """The cpu profile's services as local processes."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        # Faster than modelled speed, through the profile's own knob.
        doc = cf.load(SIM_TIME_SCALE="0.05")
        self.services = cf.active_services(doc, ("cpu",))
        self.ports: dict[str, int] = {}
        self.procs: list = []
        self.gateway_url = ""

    def start(self) -> CpuStack:
        entrypoint = df.exec_form(df.final_stage(df.instructions()), "ENTRYPOINT")
        engines = {n: s for n, s in self.services.items() if "entrypoint" in s and n != "redis"}
        gateway_name = next(n for n, s in self.services.items() if "gateway" in cf.aliases(s))
        gw = self.services[gateway_name]
        try:
            for name, svc in engines.items():
                argv = [_exe(svc["entrypoint"][0]), *svc["entrypoint"][1:], *svc["command"]]
                log = self.tmp / f"{name}.log"
                proc, self.ports[name] = start_on_port0(_retarget(argv, 0), log)
                self.procs.append(proc)
            for (name, proc) in zip(engines, self.procs, strict=True):
                url = f"http://127.0.0.1:{self.ports[name]}/health"
                wait_http(url, proc, self.tmp / f"{name}.log")

            config = self._local_config(gw)
            argv = [_exe(entrypoint[0]), *entrypoint[1:], *gw["command"]]
            env = {k: str(v) for k, v in (gw.get("environment") or {}).items()}
            log = self.tmp / "gateway.log"
            proc, port = start_on_port0(_retarget(argv, 0, config), log, env=env)
            self.procs.append(proc)
            self.gateway_url = f"http://127.0.0.1:{port}"
            wait_http(self.gateway_url + "/readyz", proc, log)
            return self
        except BaseException:
            self.stop()
            raise

    def _local_config(self, gw: dict) -> Path:
        mount = next(v for v in gw["volumes"] if v.split(":")[1] == CONFIG_IN_CONTAINER)
        config = yaml.safe_load((DEPLOY / mount.split(":")[0]).read_text())
        for model in config["models"].values():
            for pool in model["tiers"].values():
                local = []
                for url in pool["endpoints"]:
                    u = urlsplit(url)
                    assert u.port == cf.listen_port(self.services[u.hostname])
                    local.append(f"http://127.0.0.1:{self.ports[u.hostname]}")
                pool["endpoints"] = local
        state = config.get("state") or {}
        url = urlsplit(state.get("redis_url") or "")
        assert url.hostname == "redis" and url.port == REDIS_PORT, "the compose service redis"
        state["redis_url"] = url._replace(netloc=f"127.0.0.1:{REDIS_PORT}").geturl()
        path = self.tmp / "speedgate.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    def stop(self) -> None:
        stop_processes(self.procs)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CpuStack]:
    s = CpuStack(tmp_path_factory.mktemp("cpu-profile")).start()
    try:
        yield s
    finally:
        s.stop()
    assert all(p.poll() is not None for p in s.procs), "a process outlived the stack"


@pytest.mark.parametrize(("model", "tier"), [("mymodel", "standard"), ("mymodel-fast", "fast")])
def test_both_tiers_answer_through_the_gateway(stack: CpuStack, model: str, tier: str) -> None:
    body = {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
    r = httpx.post(stack.gateway_url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["x-speedgate-tier"] == tier
    assert r.json()["choices"][0]["message"]["content"]


def test_streaming_through_the_gateway(stack: CpuStack) -> None:
    body = {"model": "mymodel-fast", "stream": True, "max_tokens": 8,
            "messages": [{"role": "user", "content": "Stream, please"}]}
    with httpx.stream("POST", stack.gateway_url + "/v1/chat/completions", json=body,
                      timeout=30) as r:
        assert r.status_code == 200
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[0].removeprefix("data: "))["object"] == "chat.completion.chunk"


def test_dashboard_metrics_exist(stack: CpuStack) -> None:
    """Every metric the Grafana dashboard queries is exported by the gateway or the engines
    (after the requests above), so no panel of the provisioned dashboard is empty by a typo.
    A metric counts as exported once its ``/metrics`` declares it (``# TYPE``), samples or not:
    a labelled counter such as ``speedgate_queue_shed_total`` has none until its first event."""
    exported: set[str] = set()
    urls = [stack.gateway_url] + [f"http://127.0.0.1:{p}" for p in stack.ports.values()]
    for base in urls:
        text = httpx.get(base + "/metrics", timeout=5).text
        for family in text_string_to_metric_families(text):
            exported.update(s.name for s in family.samples)
            exported.update(_sample_names(family.name, family.type))
    dash = json.loads((DEPLOY / "observability/grafana/dashboards/speedgate.json").read_text())
    queried = set()
    for expr in promql.queries(dash):
        queried |= promql.names_and_labels(expr)[0]
    assert {"vllm:num_requests_running", "speedgate_requests_total"} <= queried
    assert queried - exported == set()


def _sample_names(family: str, kind: str) -> set[str]:
    """The sample names a declared metric family of ``kind`` exports (Prometheus text format:
    a counter's samples end in ``_total``, a histogram's in ``_bucket``/``_sum``/``_count``)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                "summary": ("", "_sum", "_count")}.get(kind, ("",))
    return {family + s for s in suffixes}


def test_user_checks_pass_and_the_state_is_in_redis(stack: CpuStack) -> None:
    """The checks deploy/test-stack.sh runs against the containers (tests/deploy/stack_checks.py),
    here against the same services as processes; the session's usage totals are in Redis."""
    client = redis.Redis(host="127.0.0.1", port=REDIS_PORT, socket_timeout=5)
    try:
        client.ping()
    except redis.RedisError:
        client.close()
        pytest.skip(f"no Redis on 127.0.0.1:{REDIS_PORT} (tests/ensure-redis.sh starts one)")
    session = f"cpu-profile-{uuid.uuid4().hex}"
    try:
        stack_checks.check_api(stack.gateway_url, session)
        key = RedisUsageStore(client).session_hash(None, session)
        assert int(client.hget(key, "requests") or 0) == stack_checks.API_REQUESTS
    finally:
        client.close()
