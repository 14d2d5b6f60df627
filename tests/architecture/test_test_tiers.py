"""The Makefile's test tiers (``make check``, ``test-unit``, ``test-e2e``, the integration
targets, ``test-bench``) between them run every test folder that ``make test`` runs, so a test
added in a new folder is never left out of every tier but the whole suite."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TIERS = ("check", "test-unit", "test-e2e", "test-vllm", "test-agents", "test-clients",
         "test-deploy", "test-bench")


def _recipe(make: str, target: str) -> str:
    """The recipe lines of ``target`` (up to the next blank line)."""
    return make.split(f"\n{target}: ", 1)[1].split("\n\n", 1)[0]


def test_the_tiers_cover_every_test_folder() -> None:
    make = (ROOT / "Makefile").read_text()
    covered = {p for t in TIERS for p in re.findall(r"\btests/\w+", _recipe(make, t))}
    folders = {f"tests/{d.name}" for d in (ROOT / "tests").iterdir()
               if d.is_dir() and any(d.rglob("test_*.py"))}
    assert folders - covered == set()


def test_check_leaves_out_only_the_slow_tests_and_stack_folders() -> None:
    recipe = _recipe((ROOT / "Makefile").read_text(), "check")
    assert "mypy gateway" in recipe and "ruff check ." in recipe
    assert '-m "not slow" tests/unit tests/architecture' in recipe
