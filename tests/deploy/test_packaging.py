"""Building the package is quiet. setuptools (≥ 77, in pip's isolated build
environment, as ``pip install``, ``pip wheel`` and the Dockerfile build) used to warn three
times that ``project.license`` as a TOML table is deprecated (PEP 639)."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest

from tests.deploy import dockerfile as df
from tests.deploy.tools import REPO

pytestmark = pytest.mark.timeout(300)


def test_item5_license_is_an_spdx_expression():
    doc = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert doc["project"]["license"] == "Apache-2.0"
    assert not [c for c in doc["project"].get("classifiers", []) if c.startswith("License ::")]
    assert "setuptools>=77" in doc["build-system"]["requires"]


def test_item5_building_the_wheel_logs_no_license_warning(tmp_path):
    context = tmp_path / "context"
    df.copy_build_context(context)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-v",
                        "--wheel-dir", str(tmp_path / "wheels"), "."],
                       cwd=context, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout + r.stderr
    assert "license" not in out.lower().replace("license-file", ""), out[-3000:]
    assert list((tmp_path / "wheels").glob("speedgate-*.whl"))
