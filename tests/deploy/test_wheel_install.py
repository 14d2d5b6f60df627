"""The Dockerfile's install steps, here: build wheels from the docker build context in one fresh
venv (the build stage), install them with no index into another (the runtime stage), then run
`speedgate --help` and serve a request from that install.

About a minute, most of it pip; pip's download cache makes reruns faster. The build uses pip's
cache where the Dockerfile says --no-cache-dir (which only keeps the image small).
"""

from __future__ import annotations

import subprocess
import sys
import venv
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.deploy import dockerfile as df
from tests.deploy.processes import start_on_port0, stop_processes, wait_http

pytestmark = pytest.mark.timeout(300)


def _run(*argv: str | Path, cwd: Path) -> str:
    r = subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, f"{argv}:\n{r.stdout}\n{r.stderr}"
    return r.stdout


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``bin/`` of a venv that has speedgate installed the way the image installs it."""
    tmp = tmp_path_factory.mktemp("wheel-install")
    context, wheels = tmp / "context", tmp / "wheels"
    copied = df.copy_build_context(context)
    assert "pyproject.toml" in copied

    build = tmp / "build-venv"
    venv.create(build, with_pip=True)
    # Dockerfile build stage: RUN pip wheel --no-cache-dir --wheel-dir /wheels .
    _run(build / "bin" / "pip", "wheel", "--quiet", "--wheel-dir", wheels, ".", cwd=context)
    (own,) = wheels.glob("speedgate-*.whl")

    runtime = tmp / "runtime-venv"
    venv.create(runtime, with_pip=True)
    # Dockerfile runtime stage: pip install --no-cache-dir --no-index --find-links /wheels
    # /wheels/speedgate-*.whl
    _run(runtime / "bin" / "pip", "install", "--quiet", "--no-cache-dir", "--no-index",
         "--find-links", wheels, own, cwd=tmp)
    yield runtime / "bin"


def test_installed_package_is_the_one_in_use(runtime: Path, tmp_path: Path) -> None:
    where = _run(runtime / "python", "-c", "import gateway, engines; print(gateway.__file__)",
                 cwd=tmp_path)
    assert str(runtime.parent) in where, "imported from the install, not the source tree"
    assert sys.prefix not in where


def test_speedgate_help(runtime: Path, tmp_path: Path) -> None:
    out = _run(runtime / "speedgate", "--help", cwd=tmp_path)
    for command in ("serve", "check-config", "demo"):
        assert command in out


def test_installed_gateway_serves_a_request(runtime: Path, tmp_path: Path) -> None:
    procs = []
    try:
        sim_log, gw_log = tmp_path / "sim.log", tmp_path / "gw.log"
        sim, sim_port = start_on_port0([str(runtime / "speedgate-sim"), "--port", "0",
                                        "--served-model-name", "m", "--time-scale", "0"],
                                       sim_log, cwd=tmp_path)
        procs.append(sim)
        wait_http(f"http://127.0.0.1:{sim_port}/health", procs[0], sim_log)
        config = {
            "models": {"m": {"tiers": {"standard": {
                "served_model_name": "m", "endpoints": [f"http://127.0.0.1:{sim_port}"],
            }}}},
        }
        (tmp_path / "gw.yaml").write_text(yaml.safe_dump(config))
        _run(runtime / "speedgate", "check-config", "gw.yaml", cwd=tmp_path)
        gw, gw_port = start_on_port0([str(runtime / "speedgate"), "serve", "--config", "gw.yaml",
                                      "--host", "127.0.0.1", "--port", "0"], gw_log, cwd=tmp_path)
        procs.append(gw)
        base = f"http://127.0.0.1:{gw_port}"
        wait_http(base + "/healthz", procs[1], gw_log)
        r = httpx.post(base + "/v1/chat/completions", timeout=30, json={
            "model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] > 0
    finally:
        stop_processes(procs)
