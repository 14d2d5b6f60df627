"""The gateway Dockerfile: hadolint, and the invariants hadolint does not know about."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib

from tests.deploy import dockerfile as df
from tests.deploy.tools import REPO, venv_tool

INSTRS = df.instructions()
FINAL = df.final_stage(INSTRS)


def test_hadolint_is_clean() -> None:
    r = subprocess.run(
        [venv_tool("hadolint"), "--format", "json", str(df.DOCKERFILE)],
        capture_output=True, text=True,
    )
    assert r.returncode == 0 and json.loads(r.stdout or "[]") == [], r.stdout + r.stderr


def test_multi_stage_on_a_slim_python_base() -> None:
    froms = [a for w, a in INSTRS if w == "FROM"]
    assert len(froms) >= 2, "build and runtime stages"
    base = next(a for w, a in INSTRS if w == "ARG" and a.startswith("PYTHON_IMAGE="))
    assert re.fullmatch(r"PYTHON_IMAGE=python:3\.\d+-slim-\w+", base), base
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == ">=3.11" and "python:3.11" in base


def test_runs_as_a_numeric_non_root_user() -> None:
    users = [a for w, a in FINAL if w == "USER"]
    assert users, "the runtime stage sets USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) > 0, "numeric, so Kubernetes runAsNonRoot can verify it"


def test_healthcheck_probes_healthz() -> None:
    checks = [a for w, a in FINAL if w == "HEALTHCHECK"]
    assert checks and "/healthz" in checks[-1]
    assert "SPEEDGATE_SERVER__PORT" in checks[-1], "follows a port override"


def test_entrypoint_is_speedgate_serve_with_a_mounted_config() -> None:
    assert df.exec_form(FINAL, "ENTRYPOINT") == ["speedgate", "serve"]
    cmd = df.exec_form(FINAL, "CMD")
    assert cmd[cmd.index("--config") + 1] == "/etc/speedgate/speedgate.yaml"
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0"
    assert [a for w, a in FINAL if w == "EXPOSE"] == [cmd[cmd.index("--port") + 1]]


def test_dependencies_come_from_the_project_metadata() -> None:
    runs = [a for w, a in INSTRS if w == "RUN"]
    assert any(re.search(r"pip wheel .*--wheel-dir /wheels \.$", r) for r in runs)
    install = [r for r in runs if "pip install" in r]
    assert install and all("--no-index" in r and "--no-cache-dir" in r for r in install)
    assert not [a for w, a in FINAL if w in ("COPY", "ADD") and a.split()[0] == "."], (
        "sources stay in the build stage; the runtime gets wheels only"
    )


def test_no_secrets_in_the_image() -> None:
    secretish = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.I)
    for word, args in INSTRS:
        if word in ("ENV", "ARG", "LABEL"):
            assert not secretish.search(args), f"{word} {args}"
    for rel in ("Dockerfile", ".dockerignore"):
        text = (REPO / rel).read_text()
        assert not re.search(r"(hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9]{20,})", text)


def test_build_context_is_only_the_package() -> None:
    """.dockerignore denies by default; what passes is what pyproject.toml builds from."""
    rules = [line for line in df.DOCKERIGNORE.read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert rules[0] == "*", "deny everything first"
    for rel in ("pyproject.toml", "gateway/app.py", "engines/sim/app.py"):
        assert df.in_context(rel), rel
    for rel in (".venv/bin/python", ".git/HEAD", "tests/unit/test_config.py", "deploy/.env",
                "gateway/__pycache__/app.cpython-311.pyc", "engines/profiles/standard.yaml"):
        assert not df.in_context(rel), rel
    readme = tomllib.loads((REPO / "pyproject.toml").read_text())["project"].get("readme")
    if readme:
        assert df.in_context(readme), "the wheel's metadata reads the readme"


def test_builds_with_no_registry() -> None:
    """No `# syntax=` directive (BuildKit would pull that frontend image from Docker Hub), and
    pip's index can be swapped for local wheels by build arguments alone."""
    first = df.DOCKERFILE.read_text().splitlines()[0]
    assert not first.replace(" ", "").lower().startswith("#syntax="), first
    build = INSTRS[: max(i for i, (w, _) in enumerate(INSTRS) if w == "FROM")]
    args = {a.split("=")[0] for w, a in build if w == "ARG"}
    assert {"PYTHON_IMAGE", "PIP_NO_INDEX", "PIP_FIND_LINKS"} <= args
    assert df.in_context(".docker-wheels/pydantic-2.0-py3-none-any.whl")
