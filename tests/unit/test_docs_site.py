"""The documentation site (mkdocs.yml, docs/) and the README: the pages other changes write into
exist under their agreed names, a strict build fails on a dead link but ignores docs/pending/,
``make test`` builds the site, and the README stays a short page for users whose examples
install what they import."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
#: The page names other changes write their sections for (``<!-- page: X.md -->``).
PAGES = {"index.md", "getting-started.md", "agents.md", "tiers.md", "resilience.md",
         "sessions.md", "admission.md", "telemetry.md", "console.md", "deployment.md",
         "configuration.md", "simulator.md", "benchmarks.md", "architecture.md",
         "capacity.md", "contributing.md"}


def _nav_pages(nav: list) -> set[str]:
    out: set[str] = set()
    for item in nav:
        for value in (item.values() if isinstance(item, dict) else [item]):
            out |= _nav_pages(value) if isinstance(value, list) else {value}
    return out


def _config() -> dict:
    return yaml.safe_load((REPO / "mkdocs.yml").read_text())


def test_the_nav_has_exactly_the_agreed_pages_and_each_exists():
    cfg = _config()
    assert _nav_pages(cfg["nav"]) == PAGES
    assert {p.name for p in (REPO / "docs").glob("*.md")} == PAGES
    assert cfg["theme"]["name"] == "material"
    assert cfg["strict"] is True
    # offline: no plugin that fetches at build time, no web fonts
    assert [p if isinstance(p, str) else next(iter(p)) for p in cfg["plugins"]] == ["search"]
    assert cfg["theme"]["font"] is False
    assert "pending/" in cfg["exclude_docs"].split()


def _make_test_mkdocs_args() -> list[str]:
    """The arguments ``make test`` gives ``mkdocs build`` (so the test runs what it runs)."""
    make = (REPO / "Makefile").read_text()
    recipe = make.split("\ntest: ", 1)[1].split("\n\n", 1)[0]
    (line,) = [ln for ln in recipe.splitlines() if "mkdocs build" in ln]
    return line.split("mkdocs build", 1)[1].split()


def _build(docs: Path, tmp: Path) -> subprocess.CompletedProcess[str]:
    site = tmp / "site"
    cfg = tmp / "mkdocs.yml"
    cfg.write_text((REPO / "mkdocs.yml").read_text().replace("docs_dir: docs", f"docs_dir: {docs}"))
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", *_make_test_mkdocs_args(),
                           "-f", str(cfg), "--site-dir", str(site)],
                          capture_output=True, text=True, timeout=120,
                          env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})


@pytest.mark.slow
def test_a_strict_build_fails_on_a_dead_link_and_ignores_pending_sections(tmp_path):
    docs = tmp_path / "docs"
    shutil.copytree(REPO / "docs", docs, ignore=shutil.ignore_patterns("pending", "__pycache__"))
    (docs / "pending").mkdir()
    (docs / "pending" / "99.md").write_text(
        "<!-- page: resilience.md -->\n## Coming\n\nSee [nowhere](nowhere.md#x).\n")
    r = _build(docs, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (tmp_path / "site" / "pending").exists()
    page = docs / "tiers.md"
    page.write_text(page.read_text() + "\nSee [the gone page](gone.md).\n")
    r = _build(docs, tmp_path)
    assert r.returncode != 0 and "gone.md" in r.stdout + r.stderr
    page.write_text(page.read_text().replace("[the gone page](gone.md)",
                                             "[a missing anchor](agents.md#no-such-section)"))
    r = _build(docs, tmp_path)
    assert r.returncode != 0 and "no-such-section" in r.stdout + r.stderr


def test_make_test_builds_the_site_strictly():
    # --quiet would hide the warnings --strict counts: a dead link would then pass
    args = _make_test_mkdocs_args()
    assert "--strict" in args and "--quiet" not in args and "-q" not in args


def test_the_readme_is_short_and_for_users():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    assert not re.search(r"\bissue\s*#?\d+", text, re.I)
    for cmd in ("make demo", "make test", "curl -s http://127.0.0.1:8080/v1/chat/completions"):
        assert cmd in text
    # one example per API, and the SDKs they import installed by a line before them
    for api in ("chat.completions.create", "responses.create", "messages.stream"):
        assert api in text, api
    install = text.index("pip install -q openai anthropic")
    assert install < text.index("from openai import") and install < text.index("import anthropic")
    # every page it links to exists
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (REPO / link).exists(), link


def test_no_issue_numbers_in_the_pages():
    for page in (REPO / "docs").glob("*.md"):
        assert not re.search(r"\bissue\s*#?\d+", page.read_text(), re.I), page.name
