"""The Docker stack test's scripts (deploy/test-stack.sh, deploy/offline/*.sh) without running
Docker: shellcheck, the skip path where no engine can be reached, and the CLI of the checks.

The real run (image build, compose up, checks, teardown) is `make stack-test`, which .ci/run
calls; it needs a Docker engine and minutes, so it is not part of the pytest suite."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.deploy.tools import REPO, venv_tool

SCRIPTS = [REPO / "deploy/test-stack.sh", *sorted((REPO / "deploy/offline").glob("*.sh"))]


def test_scripts_pass_shellcheck() -> None:
    assert len(SCRIPTS) == 4
    r = subprocess.run([venv_tool("shellcheck"), *map(str, SCRIPTS)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


def test_no_engine_is_a_skip_with_its_reason(tmp_path) -> None:
    """No reachable Docker daemon: exit 77 and a SKIP line, nothing built or started."""
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}
    r = subprocess.run(["bash", str(REPO / "deploy/test-stack.sh")], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 77, r.stdout + r.stderr
    assert r.stdout.startswith("SKIP: docker stack test: "), r.stdout


def test_ci_entry_reports_a_skip_and_passes(tmp_path) -> None:
    """ci-stack.sh where no engine can be had (none reachable; no dockerd, apt-get or sudo on
    PATH): a SKIP line naming the reason, exit 0, nothing started."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "id", "dirname", "timeout", "cat", "seq", "sleep", "tail", "mkdir"):
        src = subprocess.run(["bash", "-c", f"command -v {tool}"], capture_output=True,
                             text=True).stdout.strip()
        (bin_dir / tool).symlink_to(src)
    env = {**os.environ, "PATH": str(bin_dir),
           "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock",
           "SPEEDGATE_DOCKERD_DIR": str(tmp_path / "dockerd")}
    r = subprocess.run([str(bin_dir / "bash"), str(REPO / "deploy/offline/ci-stack.sh")],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SKIP: docker stack test: " in r.stdout, r.stdout
    assert not (tmp_path / "dockerd").exists(), "no dockerd was started"


def test_stack_checks_cli_fails_clearly_on_a_dead_gateway() -> None:
    """A check that cannot reach the gateway fails (exit 1) naming the step, never passes."""
    r = subprocess.run([sys.executable, "-m", "tests.deploy.stack_checks", "http://127.0.0.1:9",
                        "ledger", "--session", "s"],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "FAIL (ledger)" in r.stderr, r.stdout + r.stderr
