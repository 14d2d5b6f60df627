"""The config files of ``docs/agents/`` (the ones the agent tests run the agents with) are
the ones ``docs/agents.md`` shows: each file's lines other than comments appear there as one
block, so the page cannot drift from what is tested."""

from __future__ import annotations

import json
import tomllib

import pytest

from tests.agents.harness import DOCS_AGENTS, DOCS_BASE_URL, docs_env

PAGE = DOCS_AGENTS.parent / "agents.md"


@pytest.mark.parametrize("name", ["claude-code.env", "codex-config.toml", "opencode.json"])
def test_page_shows_the_tested_file(name: str) -> None:
    body = "\n".join(line for line in (DOCS_AGENTS / name).read_text().splitlines()
                     if not line.startswith("#")).strip()
    assert body in PAGE.read_text(), f"docs/agents.md does not show docs/agents/{name}"
    assert f"](agents/{name})" in PAGE.read_text()


def test_files_parse_and_name_the_demo() -> None:
    """Each file parses in its own format and names the demo's URL and model."""
    codex = tomllib.loads((DOCS_AGENTS / "codex-config.toml").read_text())
    assert codex["model"] == "mymodel-fast" and codex["model_provider"] == "speedgate"
    provider = codex["model_providers"]["speedgate"]
    assert provider["name"] == "speedgate"  # Codex refuses a provider without a name
    assert provider["base_url"] == f"{DOCS_BASE_URL}/v1" and provider["wire_api"] == "responses"
    oc = json.loads((DOCS_AGENTS / "opencode.json").read_text())
    assert oc["model"] == "speedgate/mymodel-fast"
    assert oc["provider"]["speedgate"]["options"]["baseURL"] == f"{DOCS_BASE_URL}/v1"
    env = docs_env("claude-code.env", DOCS_BASE_URL)
    assert env["ANTHROPIC_BASE_URL"] == DOCS_BASE_URL and env["ANTHROPIC_MODEL"] == "mymodel-fast"
