"""Fixtures of the agent tests: the installed agents (skipped only when npm cannot reach its
registry) and one stack per module: ``speedgate demo`` itself, on its own defaults
(``tests.agents.demo_stack``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.agents.demo_stack import DemoStack, demo_stack
from tests.agents.install import Agents, ensure_agents


@pytest.fixture(scope="session")
def agents() -> Agents:
    found, reason = ensure_agents()
    if found is None:
        pytest.skip(f"agents cannot be installed: {reason}")
    return found


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoStack]:
    s = demo_stack(tmp_path_factory.mktemp("demo"))
    try:
        yield s
    finally:
        s.stop()
