"""The newcomer's first minutes: ``--version``, the simulator's ``--help``, and
what ``make demo`` installs (the runtime only; ``make test`` adds the dev and test extras)."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from engines.sim.cli import build_parser
from gateway import __version__
from gateway.cli import main

REPO = Path(__file__).resolve().parents[2]


def test_item5_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert capsys.readouterr().out.strip() == f"speedgate {version}" == f"speedgate {__version__}"


def test_item5_sim_help_without_raw_markup_and_with_units():
    text = build_parser().format_help()
    assert not re.search(r"``|:mod:|:class:|:func:", text), text
    units = ("token", "ms", "second", "block", "sequence", "0..1", "multiplier", "integer",
             "port")
    for action in build_parser()._actions:
        if action.type in (int, float):
            assert action.help and any(u in action.help for u in units), action.option_strings
    assert "(default: 0.07)" in " ".join(text.split())  # defaults shown (wrapping varies)


def _dry_run(target: str, venv: Path) -> str:
    r = subprocess.run(["make", "-n", "-C", str(REPO), target, f"VENV={venv}"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_item5_make_demo_installs_only_the_runtime(tmp_path):
    venv = tmp_path / "fresh-venv"  # nothing installed yet: make plans the whole install
    demo = _dry_run("demo", venv)
    installs = [ln for ln in demo.splitlines() if " install " in ln]
    assert installs and all("[dev]" not in ln for ln in installs), demo
    assert "exec " in demo  # the demo replaces make's shell: SIGTERM reaches it
    test = _dry_run("test", venv)
    assert "'.[dev]'" in test and " -e ." in test, test
