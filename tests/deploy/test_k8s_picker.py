"""Picker-mode manifests (deploy/k8s/picker): rendered with kustomize, core objects validated
against the Kubernetes schemas offline (strict), the Gateway API / Inference Extension objects
against their projects' published CRD schemas (tests/deploy/crds), and all checked for what ties
them together: the pool's selector takes both tiers' engine
pods, its endpoint picker reference names the picker's Service and port, the picker watches
that same selector with rights to do so, its probes are gRPC health, the route leads to the
pool, and the picker's config and arguments are accepted by speedgate itself."""

from __future__ import annotations

import copy
import subprocess

import pytest
import yaml

from gateway.cli import build_parser
from gateway.config import load_config
from tests.deploy.crds.validate import SCHEMAS, errors
from tests.deploy.tools import DEPLOY, system_tool

CRD_KINDS = {"InferencePool", "Gateway", "HTTPRoute"}


@pytest.fixture(scope="module")
def objs() -> list[dict]:
    kubectl = system_tool("kubectl", "it renders the kustomize overlays (`kubectl kustomize`)")
    r = subprocess.run([kubectl, "kustomize", str(DEPLOY / "k8s/picker")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def one(objs: list[dict], kind: str, name: str | None = None) -> dict:
    (o,) = [o for o in objs if o["kind"] == kind
            and (name is None or o["metadata"]["name"] == name)]
    return o


def _matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _picker_args(objs: list[dict]) -> list[str]:
    (c,) = one(objs, "Deployment", "speedgate-picker")["spec"]["template"]["spec"]["containers"]
    assert c["command"] == ["speedgate"]
    return c["args"]


def test_core_objects_valid_against_kubernetes_schemas(objs: list[dict]) -> None:
    kv = pytest.importorskip("kubernetes_validate")
    core = [o for o in objs if o["kind"] not in CRD_KINDS]
    assert {o["kind"] for o in core} >= {"Deployment", "Service", "ServiceAccount", "Role",
                                         "RoleBinding", "ConfigMap", "Namespace"}
    for o in core:
        kv.validate(o, kv.latest_version(), strict=True)


def test_custom_resources_valid_against_published_crds(objs: list[dict]) -> None:
    """InferencePool, HTTPRoute and Gateway against the CRD schemas their projects publish
    (tests/deploy/crds: types, enums, required and unknown fields; not the CEL rules)."""
    custom = [o for o in objs if o["kind"] in CRD_KINDS]
    assert {(o["apiVersion"], o["kind"]) for o in custom} == set(SCHEMAS)
    for o in custom:
        assert errors(o) == [], (o["kind"], errors(o))


@pytest.mark.parametrize(("kind", "spoil", "needle"), [
    # the v1alpha2 field name, gone in v1
    ("InferencePool", lambda s: s.update(targetPort=8000), "'targetPort' was unexpected"),
    ("InferencePool", lambda s: s["endpointPickerRef"].update(failureMode="FailSoft"),
     "'FailSoft' is not one of"),
    ("InferencePool", lambda s: s.pop("selector"), "'selector' is a required"),
    ("HTTPRoute", lambda s: s["rules"][0]["backendRefs"][0].update(port="80"),
     "'80' is not of type 'integer'"),
    ("Gateway", lambda s: s["listeners"][0].update(protocol=7), "7 is not of type"),
])
def test_the_crd_check_refuses_a_spoiled_manifest(objs: list[dict], kind: str, spoil,
                                                 needle: str) -> None:
    """The check can fail: a field the CRD does not declare, a value outside an enum, a
    missing required field and a wrong type are each reported."""
    o = copy.deepcopy(one(objs, kind))
    spoil(o["spec"])
    found = errors(o)
    assert found and any(needle in e for e in found), found


def test_pool_holds_both_tiers_and_points_at_the_picker(objs: list[dict]) -> None:
    pool = one(objs, "InferencePool", "mymodel")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    selector = pool["spec"]["selector"]["matchLabels"]
    tiers = set()
    for dep in (o for o in objs if o["kind"] == "Deployment"
                and o["metadata"]["name"].startswith("engine-")):
        labels = dep["spec"]["template"]["metadata"]["labels"]
        assert _matches(selector, labels)
        tiers.add(labels["speedgate.io/tier"])
        (c,) = dep["spec"]["template"]["spec"]["containers"]
        assert c["ports"][0]["containerPort"] == pool["spec"]["targetPorts"][0]["number"]
    assert tiers == {"standard", "fast"}
    ref = pool["spec"]["endpointPickerRef"]
    assert ref["failureMode"] in ("FailClose", "FailOpen")
    svc = one(objs, "Service", ref["name"])
    (port,) = svc["spec"]["ports"]
    assert port["port"] == ref["port"]["number"] and port["appProtocol"] == "http2"
    picker = one(objs, "Deployment", "speedgate-picker")["spec"]["template"]
    assert _matches(svc["spec"]["selector"], picker["metadata"]["labels"])


def test_picker_watches_the_pool_selector_with_rbac(objs: list[dict]) -> None:
    args = build_parser().parse_args(_picker_args(objs))
    assert args.command == "picker"
    pool = one(objs, "InferencePool", "mymodel")
    selector = ",".join(f"{k}={v}" for k, v in pool["spec"]["selector"]["matchLabels"].items())
    assert args.k8s_pods == selector
    assert args.k8s_target_port == pool["spec"]["targetPorts"][0]["number"]
    assert args.port == pool["spec"]["endpointPickerRef"]["port"]["number"]
    pod = one(objs, "Deployment", "speedgate-picker")["spec"]["template"]["spec"]
    sa = pod["serviceAccountName"]
    role = one(objs, "Role", "speedgate-picker")
    (rule,) = role["rules"]
    assert rule["resources"] == ["pods"] and set(rule["verbs"]) == {"get", "list", "watch"}
    binding = one(objs, "RoleBinding", "speedgate-picker")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa,
                                    "namespace": "speedgate-picker"}]
    (c,) = pod["containers"]
    assert c["livenessProbe"]["grpc"]["service"] == "liveness"
    assert c["readinessProbe"]["grpc"]["service"] == "readiness"
    assert c["livenessProbe"]["grpc"]["port"] == args.port


def test_route_leads_to_the_pool_through_the_gateway(objs: list[dict]) -> None:
    route = one(objs, "HTTPRoute", "mymodel")
    gw = one(objs, "Gateway", "inference-gateway")
    assert [p["name"] for p in route["spec"]["parentRefs"]] == [gw["metadata"]["name"]]
    (rule,) = route["spec"]["rules"]
    (backend,) = rule["backendRefs"]
    assert backend == {"group": "inference.networking.k8s.io", "kind": "InferencePool",
                       "name": "mymodel"}


def test_picker_config_loads(objs: list[dict], tmp_path) -> None:
    cm = next(o for o in objs if o["kind"] == "ConfigMap"
              and o["metadata"]["name"].startswith("speedgate-picker-config"))
    path = tmp_path / "speedgate.yaml"
    path.write_text(cm["data"]["speedgate.yaml"])
    cfg = load_config(path)
    assert set(cfg.models["mymodel"].tiers) == {"standard", "fast"}
    pod = one(objs, "Deployment", "speedgate-picker")["spec"]["template"]["spec"]
    assert cm["metadata"]["name"] == pod["volumes"][0]["configMap"]["name"]
