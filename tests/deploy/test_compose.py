"""deploy/compose.yaml without a Docker engine: schema, references, ports, configs, variables."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from importlib import resources
from urllib.parse import urlsplit

import pytest
import yaml

from tests.deploy import composefile as cf
from tests.deploy import dockerfile as df
from tests.deploy.tools import BIN, DEPLOY, PROFILES, REPO

PROFILE_IDS = [",".join(p) for p in cf.PROFILE_SETS]


@pytest.fixture(scope="module")
def doc() -> dict:
    return cf.load()


@pytest.mark.parametrize("profiles", cf.PROFILE_SETS, ids=PROFILE_IDS)
def test_valid_against_compose_spec_schema(doc: dict, profiles: tuple[str, ...]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    vendor = pytest.importorskip("check_jsonschema.builtin_schemas.vendor")
    schema = json.loads((resources.files(vendor) / "compose-spec.json").read_text())
    resolved = {**doc, "services": cf.active_services(doc, profiles)}
    errors = sorted(
        jsonschema.Draft202012Validator(schema).iter_errors(resolved), key=lambda e: e.path
    )
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


def test_schema_check_catches_a_broken_file() -> None:
    """Control: the validator above really rejects what compose would reject."""
    jsonschema = pytest.importorskip("jsonschema")
    vendor = pytest.importorskip("check_jsonschema.builtin_schemas.vendor")
    schema = json.loads((resources.files(vendor) / "compose-spec.json").read_text())
    bad = {"services": {"x": {"image": "a", "helthcheck": {"test": ["CMD", "true"]}}}}
    assert list(jsonschema.Draft202012Validator(schema).iter_errors(bad))


@pytest.mark.parametrize("profiles", cf.PROFILE_SETS, ids=PROFILE_IDS)
def test_docker_compose_config_accepts_it(profiles: tuple[str, ...]) -> None:
    """The real compose CLI's offline `config` check, where one is installed (the Docker CLI's
    compose plugin, or Debian's docker-compose)."""
    if shutil.which("docker") and subprocess.run(
        ["docker", "compose", "version"], capture_output=True
    ).returncode == 0:
        cmd = ["docker", "compose"]
    elif shutil.which("docker-compose"):
        cmd = ["docker-compose"]
    else:
        pytest.skip("neither `docker compose` nor `docker-compose` installed (schema test ran)")
    env = {**os.environ, "COMPOSE_PROFILES": ",".join(profiles)}
    r = subprocess.run(
        [*cmd, "-f", str(cf.COMPOSE), "config", "-q"], capture_output=True, text=True, env=env
    )
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("profiles", cf.PROFILE_SETS, ids=PROFILE_IDS)
def test_everything_referenced_exists(doc: dict, profiles: tuple[str, ...]) -> None:
    services = cf.active_services(doc, profiles)
    names = cf.dns_names(services)
    for name, svc in services.items():
        for dep in svc.get("depends_on", {}):
            assert dep in services, f"{name} depends on {dep}, not in profiles {profiles}"
        for vol in svc.get("volumes", []):
            source = vol.split(":")[0]
            if source.startswith((".", "/")):
                assert (DEPLOY / source).resolve().exists(), f"{name}: bind source {source}"
            else:
                assert source in doc["volumes"], f"{name}: undeclared volume {source}"
    if "observability" in profiles:
        prom = yaml.safe_load((DEPLOY / "observability/prometheus.yml").read_text())
        for job in prom["scrape_configs"]:
            for sd in job["dns_sd_configs"]:
                for target in sd["names"]:
                    assert target in names, f"prometheus job {job['job_name']}: no {target}"
                    for svc_name in names[target]:
                        assert cf.listen_port(services[svc_name]) == sd["port"]
    assert {"gateway", "engine-standard", "engine-fast"} <= names.keys()


@pytest.mark.parametrize("profiles", cf.PROFILE_SETS, ids=PROFILE_IDS)
def test_published_ports_do_not_clash(doc: dict, profiles: tuple[str, ...]) -> None:
    seen: dict[tuple[str, str], str] = {}
    for name, svc in cf.active_services(doc, profiles).items():
        for spec in svc.get("ports", []):
            *host_ip, host_port, _container = str(spec).split(":")
            key = (host_ip[0] if host_ip else "0.0.0.0", host_port)
            assert key not in seen, f"{name} and {seen[key]} both publish {key}"
            seen[key] = name


def test_defaults_publish_only_on_loopback(doc: dict) -> None:
    """No API keys yet: nothing listens beyond this host unless the operator says so."""
    for name, svc in doc["services"].items():
        for spec in svc.get("ports", []):
            assert str(spec).startswith("127.0.0.1:"), f"{name} publishes {spec}"


@pytest.mark.parametrize("stack", ["cpu", "gpu"])
def test_gateway_config_validates_and_points_at_the_engines(doc: dict, stack: str) -> None:
    services = cf.active_services(doc, (stack,))
    gateways = [n for n, s in services.items() if "gateway" in cf.aliases(s)]
    assert len(gateways) == 1, gateways
    gw = services[gateways[0]]
    mount = next(v for v in gw["volumes"] if v.split(":")[1] == "/etc/speedgate/speedgate.yaml")
    config_path = (DEPLOY / mount.split(":")[0]).resolve()
    r = subprocess.run(
        [str(BIN / "speedgate"), "check-config", str(config_path)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert gw["command"][gw["command"].index("--config") + 1] == "/etc/speedgate/speedgate.yaml"

    config = yaml.safe_load(r.stdout)
    names = cf.dns_names(services)
    for model in config["models"].values():
        for tier, pool in model["tiers"].items():
            for url in pool["endpoints"]:
                u = urlsplit(url)
                assert u.hostname in services, f"{url}: no service {u.hostname} in {stack}"
                engine = services[u.hostname]
                assert cf.listen_port(engine) == u.port, f"{url}: {u.hostname} listens elsewhere"
                assert u.hostname in names[f"engine-{tier}"], f"{url} is not a {tier} engine"
                assert _served_name(engine) == pool["served_model_name"]


def _served_name(engine: dict) -> str:
    cmd = [str(c) for c in engine.get("command", [])]
    if "--served-model-name" in cmd:
        return cmd[cmd.index("--served-model-name") + 1]
    return engine["environment"]["SERVED_MODEL_NAME"]


def test_every_variable_is_documented_in_env_file() -> None:
    used = cf.variables_used(cf.COMPOSE.read_text())
    documented = set(cf.read_env_file())
    secrets_from_shell = {"HF_TOKEN"}
    assert used - documented - secrets_from_shell == set()
    compose_own = {"COMPOSE_PROFILES", "COMPOSE_PROJECT_NAME"}
    assert documented - used - compose_own == set(), "unused settings in deploy/.env"
    assert cf.read_env_file()["COMPOSE_PROFILES"] == "cpu", "cpu is the try-it-out default"


def test_gpu_engines(doc: dict) -> None:
    services = cf.active_services(doc, ("gpu",))
    devices = {}
    for tier in ("standard", "fast"):
        svc = services[f"vllm-{tier}"]
        assert svc["image"].startswith("vllm/vllm-openai:v"), "pin the engine image"
        assert svc["ipc"] == "host"
        assert svc["entrypoint"] == ["bash", "/profiles/vllm-serve.sh"]
        assert svc["command"] == [tier]
        assert "../engines/profiles:/profiles:ro" in svc["volumes"]
        assert any(v.endswith(":/root/.cache/huggingface") for v in svc["volumes"])
        (dev,) = svc["deploy"]["resources"]["reservations"]["devices"]
        assert dev["capabilities"] == ["gpu"] and dev["driver"] == "nvidia"
        devices[tier] = set(",".join(dev["device_ids"]).split(","))
        assert len(devices[tier]) == int(svc["environment"]["TP"]), "TP = GPUs of the tier"
        start = svc["healthcheck"]["start_period"]
        assert start.endswith("s") and int(start[:-1]) >= 600, "weights take minutes to load"
    assert not devices["standard"] & devices["fast"], "tiers must not share GPUs"


@pytest.mark.parametrize("tier", ["standard", "fast"])
def test_gpu_engine_launch_command(doc: dict, tier: str) -> None:
    """What vllm-serve.sh runs inside the vllm-<tier> container, from the service's environment."""
    svc = cf.active_services(doc, ("gpu",))[f"vllm-{tier}"]
    env = {k: str(v) for k, v in svc["environment"].items()}
    r = subprocess.run(
        ["bash", str(PROFILES / "vllm-serve.sh"), *svc["command"]],
        env={"PATH": os.environ["PATH"], **env, "DRY_RUN": "1"}, capture_output=True, text=True,
    )
    assert r.returncode == 0, r.stderr
    argv = r.stdout.splitlines()
    assert argv[:3] == ["vllm", "serve", env["MODEL"]]
    profile = argv[argv.index("--config") + 1]
    expected = "standard.yaml" if tier == "standard" else f"fast-{env['SPEC_METHOD']}.yaml"
    assert profile == str(PROFILES / expected)
    assert argv[argv.index("--port") + 1] == "8000"
    assert argv[argv.index("--served-model-name") + 1] == "mymodel"
    assert "--max-model-len" not in argv, "empty MAX_MODEL_LEN = the model's own length"


def test_observability_provisioning_matches_compose(doc: dict) -> None:
    graf = doc["services"]["grafana"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in graf["volumes"]}
    providers = yaml.safe_load(
        (DEPLOY / "observability/grafana/provisioning/dashboards/speedgate.yaml").read_text()
    )["providers"]
    datasource = yaml.safe_load(
        (DEPLOY / "observability/grafana/provisioning/datasources/prometheus.yaml").read_text()
    )["datasources"][0]
    assert urlsplit(datasource["url"]).hostname == "prometheus"
    assert datasource["type"] == "prometheus" and datasource["isDefault"]
    for provider in providers:
        folder = provider["options"]["path"]
        assert folder in mounts, f"{folder} not mounted where the provider reads it"
        dashboards = list((DEPLOY / mounts[folder].removeprefix("./")).glob("*.json"))
        assert dashboards, f"no dashboard in {mounts[folder]}"
        for path in dashboards:
            _check_datasources(json.loads(path.read_text()), datasource["uid"])


def _check_datasources(dash: dict, uid: str) -> None:
    """Every query names the provisioned datasource, or a datasource variable of its type."""
    variables = {v["name"]: v for v in dash.get("templating", {}).get("list", [])}
    for panel in dash["panels"]:
        for ref in [panel.get("datasource")] + [t.get("datasource") for t in
                                                panel.get("targets", [])]:
            if ref is None:
                continue
            if ref["uid"].startswith("${"):
                var = variables[ref["uid"][2:-1]]
                assert (var["type"], var["query"]) == ("datasource", "prometheus")
            else:
                assert ref["uid"] == uid, panel["title"]


def test_compose_builds_the_gateway_image_from_the_repo(doc: dict) -> None:
    for name in ("gateway", "gateway-sim", "sim-standard-1"):
        build = doc["services"][name]["build"]
        assert (DEPLOY / build["context"]).resolve() == REPO
        assert (REPO / build["dockerfile"]).is_file()


@pytest.mark.parametrize("stack", ["cpu", "gpu"])
def test_gateway_state_is_the_redis_service(doc: dict, stack: str) -> None:
    """The gateway config of each profile points state.redis_url at the profile's Redis."""
    svc = cf.active_services(doc, (stack,))
    gw = next(s for s in svc.values() if "gateway" in cf.aliases(s))
    mount = next(v for v in gw["volumes"] if v.endswith(":/etc/speedgate/speedgate.yaml:ro"))
    config = yaml.safe_load((DEPLOY / mount.split(":")[0]).read_text())
    url = urlsplit(config["state"]["redis_url"])
    assert url.scheme == "redis" and url.hostname in svc and url.port == 6379
    assert "redis" in gw["depends_on"]
    # Redis refuses clients from other hosts with no password unless protected mode is off (the
    # official image's entrypoint turns it off, a plain redis-server does not).
    command = svc[url.hostname]["command"]
    assert command[command.index("--protected-mode") + 1] == "no"


def test_redis_image_is_a_setting() -> None:
    """A Redis image built locally can stand in where redis:7 cannot be pulled."""
    assert "${REDIS_IMAGE:-redis:7" in cf.COMPOSE.read_text()
    assert cf.read_env_file()["REDIS_IMAGE"].startswith("redis:7")
    assert cf.load(REDIS_IMAGE="local/redis:7")["services"]["redis"]["image"] == "local/redis:7"


def _seconds(value: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    unit = next(u for u in ("ms", "s", "m", "h") if value.endswith(u))
    return float(value[: -len(unit)]) * units[unit]


def test_healthchecks_leave_room_on_a_busy_host(doc: dict) -> None:
    """On a small host every container starts at once: a probe (a Python interpreter) can take
    seconds, a Python service ~20 s to import; tight limits mark healthy containers unhealthy."""
    checks = {n: s["healthcheck"] for n, s in cf.active_services(doc, ("cpu",)).items()
              if "healthcheck" in s}
    assert {"redis", "sim-standard-1", "sim-fast-1"} <= set(checks)
    for name, hc in checks.items():
        assert _seconds(hc["timeout"]) >= 10, name
        assert _seconds(hc.get("start_period", "0s")) >= 30, name
    image_check = next(a for w, a in df.final_stage(df.instructions()) if w == "HEALTHCHECK")
    assert "--timeout=10s" in image_check and "--start-period=60s" in image_check
