"""Paths and tool lookup shared by the deployment tests."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
PROFILES = REPO / "engines" / "profiles"
BIN = Path(sys.executable).parent  # the venv's console scripts: speedgate, speedgate-sim, hadolint


def venv_tool(name: str) -> str:
    """Path of a console script installed in this venv (a dev dependency), or skip.

    A missing dev tool skips the test on a developer's machine but fails under CI (``CI`` set):
    CI installs the dev extras, so there a missing tool is a broken install, not a reason to skip.
    """
    path = BIN / name
    if path.exists():
        return str(path)
    msg = f"{name} not installed in this venv (pip install -e '.[dev]')"
    if os.environ.get("CI"):
        pytest.fail(msg)
    pytest.skip(msg)


def system_tool(name: str, why: str) -> str:
    """Path of a tool that pip cannot install (e.g. kubectl), or skip saying ``why`` it matters."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not on PATH: {why}")
    return path
