"""Config validation: the message names the field; env overrides the file."""

import textwrap

import pytest

from gateway.config import ConfigError, load_config

GOOD = """
models:
  m:
    default_tier: standard
    aliases: {m-fast: fast}
    fallback: {fast: standard}
    tiers:
      standard: {served_model_name: m, endpoints: ["http://127.0.0.1:9001"]}
      fast: {served_model_name: m-spec, endpoints: ["http://127.0.0.1:9002"]}
"""


def _write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(textwrap.dedent(text))
    return p


def test_good_config_loads_with_defaults(tmp_path):
    cfg = load_config(_write(tmp_path, GOOD))
    m = cfg.models["m"]
    assert m.tiers["fast"].served_model_name == "m-spec"
    assert m.tiers["standard"].timeouts.ttft_s == 300.0
    assert m.fallback_chain("fast") == ["fast", "standard"]
    assert m.fallback_chain("standard") == ["standard"]
    assert cfg.server.max_body_bytes >= 8 * 1024 * 1024


def test_example_config_is_valid():
    cfg = load_config("deploy/speedgate.example.yaml")
    assert set(cfg.models["mymodel"].tiers) == {"standard", "fast"}


@pytest.mark.parametrize(
    ("mutation", "field"),
    [
        (lambda s: s.replace("default_tier: standard", "default_tier: turbo"), "default_tier"),
        (lambda s: s.replace('endpoints: ["http://127.0.0.1:9002"]', "endpoints: []"),
         "models.m.tiers.fast.endpoints"),
        (lambda s: s.replace("http://127.0.0.1:9002", "not a url"),
         "models.m.tiers.fast.endpoints.0"),
        (lambda s: s.replace("fallback: {fast: standard}",
                             "fallback: {fast: standard, standard: fast}"), "cyclic"),
        (lambda s: s.replace("aliases: {m-fast: fast}", "aliases: {m-fast: turbo}"),
         "models.m.aliases.m-fast"),
        (lambda s: s.replace("default_tier: standard", "default_tier: standard\n    colour: red"),
         "models.m.colour"),
        (lambda s: s.replace("served_model_name: m,", "served_model_name: m, timeout: 3,"),
         "models.m.tiers.standard.timeout"),
    ],
)
def test_invalid_config_names_the_field(tmp_path, mutation, field):
    with pytest.raises(ConfigError) as ei:
        load_config(_write(tmp_path, mutation(GOOD)))
    assert field in str(ei.value)


def test_unknown_tier_in_fallback(tmp_path):
    bad = GOOD.replace("fallback: {fast: standard}", "fallback: {fast: turbo}")
    with pytest.raises(ConfigError, match="fallback"):
        load_config(_write(tmp_path, bad))


def test_env_overrides_file(tmp_path, monkeypatch):
    monkeypatch.setenv("SPEEDGATE_SERVER__PORT", "9123")
    monkeypatch.setenv("SPEEDGATE_SERVER__MAX_BODY_BYTES", "2048")
    cfg = load_config(_write(tmp_path, GOOD))
    assert cfg.server.port == 9123
    assert cfg.server.max_body_bytes == 2048
    assert "m" in cfg.models  # the file's models survive the nested override


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(_write(tmp_path, "models: [\n"))


@pytest.mark.parametrize("text", [b"\xff\xfe\x00models: {}", b"1: 2\n", b"null: x\n",
                                  b"models: {}\n1.5: x\n"])
def test_a_file_that_is_not_utf8_or_has_odd_keys_is_a_config_error(tmp_path, capsys, text):
    """``check-config`` on a UTF-16 file or one whose top-level keys are not names (YAML's
    ``1``, ``null``, ``1.5``) reports the problem; both raised a traceback before
    (UnicodeDecodeError; TypeError: keywords must be strings)."""
    from gateway.cli import main

    path = tmp_path / "c.yaml"
    path.write_bytes(text)
    with pytest.raises(ConfigError, match=r"not UTF-8 text|section names"):
        load_config(path)
    assert main(["check-config", str(path)]) != 0
    assert "Traceback" not in capsys.readouterr().err


WORKERS = GOOD + """
server: {workers: 3}
auth:
  keys:
    - id: a
      hash: "sha256:%s"
      limits: {requests_per_min: 3}
""" % ("0" * 64)


def test_workers_without_redis_warn_at_check_config_and_serve(tmp_path, capsys, monkeypatch):
    """Regression: ``server.workers > 1`` without ``state.redis_url`` kept sessions, stored
    Responses and rate limits per process silently (9 of 10 follow-ups 404, 5 of 10 admitted
    at requests_per_min 3). Both commands now name what is per process."""
    from gateway import cli

    path = str(_write(tmp_path, WORKERS))
    assert cli.main(["check-config", path]) == 0
    err = capsys.readouterr().err
    assert "WARNING: server.workers is 3 but state.redis_url is not set" in err
    for what in ("session affinity", "previous_response_id", "per-key rate limits",
                 "usage totals"):
        assert what in err
    assert "session budgets" not in err  # none configured
    started: list[int] = []
    monkeypatch.setattr(cli, "run_server", lambda config, *a, **k: started.append(
        config.server.workers))
    assert cli.main(["serve", "--config", path]) == 0 and started == [3]
    assert "WARNING: server.workers is 3" in capsys.readouterr().err
    # one worker, or Redis configured: nothing to warn about
    assert cli.main(["serve", "--config", path, "--workers", "1"]) == 0
    monkeypatch.setenv("SPEEDGATE_STATE__REDIS_URL", "redis://127.0.0.1:6379/0")
    assert cli.main(["check-config", path]) == 0
    assert "WARNING" not in capsys.readouterr().err


def test_auth_on_without_a_key_is_an_error_with_the_fix(tmp_path, capsys):
    """``auth: {enabled: true}`` with no key would refuse every request with 401; check-config
    said OK. A keys file counts as keys (read at startup)."""
    from gateway import cli

    path = str(_write(tmp_path, GOOD + "auth: {enabled: true}\n"))
    assert cli.main(["check-config", path]) == 2
    err = capsys.readouterr().err
    assert "auth: enabled is true but no API key is configured" in err
    assert "speedgate keygen" in err and "auth.enabled: false" in err
    load_config(_write(tmp_path, GOOD + "auth: {enabled: true, keys_file: /k.yaml}\n"))
    load_config(_write(tmp_path, GOOD + "auth: {enabled: false}\n"))


NEWCOMER = GOOD.replace("default_tier: standard", "default_tier: standard\n    alaises: {}") \
    .replace("aliases: {m-fast: fast}", "aliases: {m-fast: fast, m-x: turbo}") + """
  m2:
    default_tier: fast
    aliases: {m: standard}
    tiers:
      standard: {served_model_name: m, endpoints: ["http://127.0.0.1:9001"],
                 max_inflight_per_replicas: 3}
server: {prot: 8080}
auth: {enabled: true}
flow_control: {default_band: nope}
"""


def test_every_problem_is_reported_at_once_with_did_you_mean(tmp_path):
    """Field errors, each section's own checks (pydantic skips them once a field below
    fails) and the checks across sections, in one report; unknown fields name the field
    probably meant. Before: three of the eight, and no suggestion."""
    with pytest.raises(ConfigError) as ei:
        load_config(_write(tmp_path, NEWCOMER))
    lines = str(ei.value).splitlines()
    assert lines[0] == "invalid config:"
    expected = [
        "server.prot: unknown field; did you mean `port`?",
        "models.m.alaises: unknown field; did you mean `aliases`?",
        "models.m.aliases.m-x: Input should be 'standard', 'fast' or 'auto'",
        "models.m2.tiers.standard.max_inflight_per_replicas: unknown field; did you mean "
        "`max_inflight_per_replica`?",
        "auth: enabled is true but no API key is configured",
        "flow_control: default_band 'nope' is not a band",
        "models.m2: default_tier 'fast' has no pool in tiers",  # skipped by pydantic
        "(root): models.m2: name 'm' already used by 'm'",  # skipped by pydantic
    ]
    for want in expected:
        assert sum(line.strip().startswith(want) for line in lines) == 1, (want, lines)
    assert len(lines) == 1 + len(expected), lines


def test_no_suggestion_for_a_name_like_no_field(tmp_path):
    with pytest.raises(ConfigError) as ei:
        load_config(_write(tmp_path, GOOD + "server: {zzzzzz: 1}\n"))
    assert "server.zzzzzz: unknown field\n" in str(ei.value) + "\n"
