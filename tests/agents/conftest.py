"""Fixtures of the agent tests: the installed agents (skipped only when npm cannot reach its
registry) and one stack per module (2 simulators per tier + gateway)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.agents.install import Agents, ensure_agents
from tests.e2e.stack import Stack


@pytest.fixture(scope="session")
def agents() -> Agents:
    found, reason = ensure_agents()
    if found is None:
        pytest.skip(f"agents cannot be installed: {reason}")
    return found


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("stack")).start()
    try:
        yield s
    finally:
        s.stop()
