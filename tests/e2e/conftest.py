"""Fixtures: one real stack (2 simulators per tier + gateway) per test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.stack import Stack


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("stack")).start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(autouse=True)
def _clean_sims(request: pytest.FixtureRequest) -> None:
    if "stack" in request.fixturenames:
        request.getfixturevalue("stack").reset_sims()
