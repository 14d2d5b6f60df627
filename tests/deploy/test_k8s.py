"""Kubernetes manifests: render each overlay with kustomize, validate against the Kubernetes
schemas offline (kubernetes-validate ships them), and check what the schemas cannot: selectors,
references, probes, and that the gateway config names the engine replicas that exist."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from tests.deploy.tools import BIN, DEPLOY, PROFILES, system_tool

OVERLAYS = ["gpu", "cpu"]
# The newest schemas the validator ships, and an older minor still in wide use.
KUBE_VERSIONS = [None, "1.30.0"]


def render(overlay: str) -> list[dict]:
    kubectl = system_tool("kubectl", "it renders the kustomize overlays (`kubectl kustomize`)")
    r = subprocess.run([kubectl, "kustomize", str(DEPLOY / "k8s/overlays" / overlay)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


@pytest.fixture(scope="module", params=OVERLAYS)
def objs(request: pytest.FixtureRequest) -> Iterator[list[dict]]:
    yield render(request.param)


def find(objs: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [o for o in objs if o["kind"] == kind
            and (name is None or o["metadata"]["name"] == name)]


def one(objs: list[dict], kind: str, name: str) -> dict:
    (o,) = find(objs, kind, name)
    return o


@pytest.mark.parametrize("version", KUBE_VERSIONS, ids=["latest", "1.30"])
def test_valid_against_kubernetes_schemas(objs: list[dict], version: str | None) -> None:
    kv = pytest.importorskip("kubernetes_validate")
    version = version or kv.latest_version()
    for o in objs:
        kv.validate(o, version, strict=True)  # raises ValidationError naming the field


def test_schema_validation_catches_a_typo() -> None:
    """Control: strict validation really rejects an unknown field, offline."""
    kv = pytest.importorskip("kubernetes_validate")
    bad = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"},
           "spec": {"selectr": {"a": "b"}, "ports": [{"port": 80}]}}
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, kv.latest_version(), strict=True)


def _labels_match(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_gateway_deployment(objs: list[dict]) -> None:
    dep = one(objs, "Deployment", "speedgate-gateway")
    pod = dep["spec"]["template"]
    assert dep["spec"]["replicas"] >= 2
    assert _labels_match(dep["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"])
    (c,) = pod["spec"]["containers"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/healthz"  # not tied to engine health
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert "cpu" in c["resources"]["requests"], "the HPA's CPU target needs a request"
    assert c["args"][c["args"].index("--config") + 1] == "/etc/speedgate/speedgate.yaml"


def test_service_hpa_pdb_select_the_gateway(objs: list[dict]) -> None:
    dep = one(objs, "Deployment", "speedgate-gateway")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    svc = one(objs, "Service", "speedgate-gateway")
    assert _labels_match(svc["spec"]["selector"], labels)
    ports = {p["name"] for p in dep["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert all(p["targetPort"] in ports for p in svc["spec"]["ports"])
    pdb = one(objs, "PodDisruptionBudget", "speedgate-gateway")
    assert _labels_match(pdb["spec"]["selector"]["matchLabels"], labels)
    hpa = one(objs, "HorizontalPodAutoscaler", "speedgate-gateway")
    ref = hpa["spec"]["scaleTargetRef"]
    assert (ref["kind"], ref["name"]) == ("Deployment", "speedgate-gateway")
    assert hpa["spec"]["minReplicas"] >= 2


def test_every_referenced_object_exists(objs: list[dict]) -> None:
    names = {(o["kind"], o["metadata"]["name"]) for o in objs}
    namespaces = {o["metadata"].get("namespace") for o in objs if o["kind"] != "Namespace"}
    assert len(namespaces) == 1 and ("Namespace", namespaces.pop()) in names
    for o in find(objs, "Deployment") + find(objs, "StatefulSet"):
        for vol in o["spec"]["template"]["spec"].get("volumes", []):
            if "configMap" in vol:
                assert ("ConfigMap", vol["configMap"]["name"]) in names, vol
            if "secret" in vol:
                assert ("Secret", vol["secret"]["secretName"]) in names, vol
            if "persistentVolumeClaim" in vol:
                assert ("PersistentVolumeClaim", vol["persistentVolumeClaim"]["claimName"]) in names
    assert ("Service", "redis") in names and ("Deployment", "redis") in names


def _gateway_config(objs: list[dict]) -> dict:
    (cm,) = [o for o in find(objs, "ConfigMap")
             if o["metadata"]["name"].startswith("speedgate-config")]
    return yaml.safe_load(cm["data"]["speedgate.yaml"])


def test_gateway_config_passes_check_config(objs: list[dict], tmp_path: Path) -> None:
    path = tmp_path / "speedgate.yaml"
    path.write_text(yaml.safe_dump(_gateway_config(objs)))
    r = subprocess.run([str(BIN / "speedgate"), "check-config", str(path)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_pools_name_exactly_the_engine_replicas(objs: list[dict]) -> None:
    """Static endpoint lists follow the StatefulSets: <sts>-<i>.<headless service>:<port>."""
    config = _gateway_config(objs)
    for tier, pool in config["models"]["mymodel"]["tiers"].items():
        sts = one(objs, "StatefulSet", f"engine-{tier}")
        svc = one(objs, "Service", sts["spec"]["serviceName"])
        assert svc["spec"]["clusterIP"] == "None", "headless: per-pod DNS names"
        pod_labels = sts["spec"]["template"]["metadata"]["labels"]
        assert _labels_match(svc["spec"]["selector"], pod_labels)
        (port,) = svc["spec"]["ports"]
        expected = {
            f"http://{sts['metadata']['name']}-{i}.{svc['metadata']['name']}:{port['port']}"
            for i in range(sts["spec"]["replicas"])
        }
        assert set(pool["endpoints"]) == expected
        (c,) = sts["spec"]["template"]["spec"]["containers"]
        served = _served_name(c)
        assert served == pool["served_model_name"]
        assert all(urlsplit(u).port == c["ports"][0]["containerPort"] for u in expected)
        assert c["readinessProbe"]["httpGet"]["path"] == "/health"


def _served_name(container: dict) -> str:
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    if "SERVED_MODEL_NAME" in env:
        return env["SERVED_MODEL_NAME"]
    args = container["args"]
    return args[args.index("--served-model-name") + 1]


def test_gpu_engines_request_their_gpus_and_run_the_profiles() -> None:
    objs = render("gpu")
    (profiles,) = [o for o in find(objs, "ConfigMap")
                   if o["metadata"]["name"].startswith("vllm-profiles")]
    for name, text in profiles["data"].items():
        assert text == (PROFILES / name).read_text(), f"{name} differs from engines/profiles"
    for tier in ("standard", "fast"):
        sts = one(objs, "StatefulSet", f"engine-{tier}")
        spec = sts["spec"]["template"]["spec"]
        (c,) = spec["containers"]
        assert c["command"] == ["bash", "/profiles/vllm-serve.sh"] and c["args"] == [tier]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert int(env["TP"]) == int(c["resources"]["limits"]["nvidia.com/gpu"])
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert mounts["/dev/shm"] == "dshm" and "/profiles" in mounts
        assert c["startupProbe"]["failureThreshold"] * c["startupProbe"]["periodSeconds"] >= 1800
        assert sts["spec"]["podManagementPolicy"] == "Parallel"


def test_gateway_state_is_the_redis_service(objs: list[dict]) -> None:
    """The gateways share their state through the Redis the manifests run (not per-pod memory)."""
    url = urlsplit(_gateway_config(objs)["state"]["redis_url"])
    svc = one(objs, "Service", "redis")
    assert url.scheme == "redis" and url.hostname == "redis"
    assert url.port in {p["port"] for p in svc["spec"]["ports"]}
    (container,) = one(objs, "Deployment", "redis")["spec"]["template"]["spec"]["containers"]
    assert container["image"].startswith("redis:7"), "set by the kustomization's images: entry"
