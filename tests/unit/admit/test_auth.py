"""API keys: hashing, bearer parsing, keys files, entitlements and the planner's narrowing."""

from __future__ import annotations

import logging

import pytest
import yaml

from gateway.admit.audit import AuditLog
from gateway.admit.auth import (
    AuthenticationError,
    KeyRing,
    PermissionDenied,
    bearer_token,
    check_request,
    hash_key,
    load_keys,
    new_key,
)
from gateway.admit.hardening import HeadersTooLarge, check_headers, check_json_shape
from gateway.cli import main
from gateway.config import AuthConfig, ConfigError, load_config
from gateway.errors import InvalidRequest
from gateway.fleet.pools import PoolRegistry
from gateway.plan.chain import plan_request
from gateway.plan.tiers import ModelIndex


def _cfg():
    pool = {"served_model_name": "m", "endpoints": ["http://127.0.0.1:1"]}
    return load_config(models={"m": {"tiers": {"standard": pool, "fast": pool},
                                     "aliases": {"m-fast": "fast", "m-auto": "auto"},
                                     "fallback": {"standard": "fast"}}})


def test_new_key_is_random_and_only_its_hash_is_stored():
    key, digest = new_key()
    assert key.startswith("sg-") and len(key) == 46
    assert digest == hash_key(key) and key not in digest
    assert new_key()[0] != key


def test_bearer_parsing():
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer  abc ") == "abc"
    assert bearer_token("Basic abc") is None
    assert bearer_token("Bearer") is None
    assert bearer_token(None) is None


def test_keyring_authenticates_by_hash_and_never_echoes():
    key, digest = new_key()
    ring = KeyRing(AuthConfig(keys=[{"id": "a", "hash": digest}]))
    assert ring.enabled and ring.authenticate(f"Bearer {key}").id == "a"
    with pytest.raises(AuthenticationError) as e:
        ring.authenticate(f"Bearer {key}x")
    assert e.value.code == "invalid_api_key" and key not in e.value.message
    with pytest.raises(AuthenticationError) as e:
        ring.authenticate(None)
    assert e.value.code == "missing_api_key" and e.value.status == 401


def test_auth_enabled_only_when_configured():
    assert not AuthConfig().is_enabled
    assert AuthConfig(keys_file="/x").is_enabled
    assert AuthConfig(enabled=True, keys_file="/x").is_enabled
    with pytest.raises(ValueError, match="no API key"):  # on with no key: every request 401
        AuthConfig(enabled=True)
    assert not AuthConfig(enabled=False, keys_file="/x").is_enabled


def test_keys_file_merged_and_validated(tmp_path):
    _, d1 = new_key()
    f = tmp_path / "api-keys.yaml"
    f.write_text(yaml.safe_dump({"keys": [{"id": "file", "hash": d1, "tiers": ["standard"]}]}))
    keys = load_keys(AuthConfig(keys_file=str(f)))
    assert [k.id for k in keys] == ["file"]
    f.write_text(yaml.safe_dump({"keys": [{"id": "x", "hash": "sha256:nothex"}]}))
    with pytest.raises(ConfigError, match=r"api-keys\.yaml"):
        load_keys(AuthConfig(keys_file=str(f)))
    f.write_text(yaml.safe_dump({"keys": [{"id": "dup", "hash": d1}]}))
    with pytest.raises(ConfigError, match="duplicate key hash"):
        load_keys(AuthConfig(keys_file=str(f), keys=[{"id": "other", "hash": d1}]))
    with pytest.raises(ConfigError, match="cannot read"):
        load_keys(AuthConfig(keys_file=str(tmp_path / "missing.yaml")))
    (tmp_path / "empty.yaml").write_text("keys: []\n")  # the deploy's Secret before any key
    assert load_keys(AuthConfig(keys_file=str(tmp_path / "empty.yaml"))) == []


def _key(**kw):
    from gateway.admit.auth import ApiKey
    from gateway.config import ApiKeyConfig

    return ApiKey(ApiKeyConfig(id="k", hash="sha256:" + "0" * 64, **kw))


@pytest.mark.parametrize(
    "model,header,service_tier,outcome",
    [
        ("m-fast", None, None, "403"),
        ("m", "fast", None, "403"),
        ("m", None, "priority", "403"),
        ("m", "FAST", None, "403"),
        ("m-auto", None, None, "standard"),
        ("m", "auto", None, "standard"),
        ("m", None, "auto", "standard"),
        ("m", None, None, "standard"),
        ("m", "standard", "priority", "standard"),  # the header wins over service_tier
    ],
)
def test_entitlement_matrix_standard_only_key(model, header, service_tier, outcome):
    cfg = _cfg()
    pools = PoolRegistry(cfg)
    treq = ModelIndex(cfg).resolve(model, header, service_tier)
    key = _key(tiers=["standard"])
    if outcome == "403":
        with pytest.raises(PermissionDenied) as e:
            check_request(key, treq, frozenset(treq.model.tiers))
        assert e.value.code == "tier_not_allowed" and e.value.status == 403
        return
    allowed = check_request(key, treq, frozenset(treq.model.tiers))
    plan = plan_request(treq, pools, allowed)
    assert [p.tier for p in plan.chain] == ["standard"]  # the standard → fast fallback dropped


def test_fast_only_key_default_tier_narrowed_and_model_entitlement():
    cfg = _cfg()
    pools = PoolRegistry(cfg)
    idx = ModelIndex(cfg)
    key = _key(tiers=["fast"])
    treq = idx.resolve("m", None, None)
    plan = plan_request(treq, pools, check_request(key, treq, frozenset(treq.model.tiers)))
    assert [p.tier for p in plan.chain] == ["fast"] and plan.reason == "tier-not-entitled"
    with pytest.raises(PermissionDenied, match="model"):
        check_request(_key(models=["other"]), treq, frozenset(treq.model.tiers))
    assert [p.tier for p in plan_request(treq, pools).chain] == ["standard", "fast"]


def test_header_and_json_limits():
    check_headers([(b"a", b"b")], 1024)
    with pytest.raises(HeadersTooLarge):
        check_headers([(b"a", b"b" * 2000)], 1024)
    with pytest.raises(HeadersTooLarge):
        check_headers([(b"a", b"b")] * 101, 1 << 20)
    doc: dict = {"a": []}
    node = doc["a"]
    for _ in range(70):
        node.append([])
        node = node[0]
    check_json_shape({"a": [[1]]}, 64)
    with pytest.raises(InvalidRequest):
        check_json_shape(doc, 64)
    with pytest.raises(InvalidRequest):
        check_json_shape({"a": list(range(100))}, 64, max_nodes=50)


def test_audit_log_is_rate_limited(caplog):
    t = [0.0]
    audit = AuditLog(max_per_s=2, clock=lambda: t[0])
    with caplog.at_level(logging.INFO, logger="speedgate.audit"):
        for _ in range(5):
            audit.event("auth_failed", code="invalid_api_key")
        t[0] = 1.0
        audit.event("auth_failed", code="invalid_api_key")
    assert len(caplog.records) == 3
    assert '"suppressed":3' in caplog.records[-1].getMessage()


def test_keygen_prints_a_key_and_a_loadable_entry(capsys):
    assert main(["keygen", "--id", "team-a", "--tier", "standard", "--tpm", "1000"]) == 0
    out = capsys.readouterr().out
    key = next(line.split()[-1] for line in out.splitlines() if "sg-" in line)
    entries = yaml.safe_load(out)
    ring = KeyRing(AuthConfig(keys=entries))
    assert ring.authenticate(f"Bearer {key}").config.limits.tokens_per_min == 1000
