"""Fixtures: one real stack (2 simulators per tier + gateway) per test module; one headless
Chromium per test session for the browser tests (each test opens its own tab)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.browser import Chromium, find_chromium
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


@pytest.fixture(scope="session")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chromium]:
    """One headless Chromium for every browser test (skipped when none is installed; ``.ci/run``
    installs Debian's ``chromium``); tests open tabs with ``await chromium.new_page()``."""
    executable = find_chromium()
    if executable is None:
        pytest.skip("no chromium installed")
    browser = Chromium(executable, tmp_path_factory.mktemp("chromium") / "profile")
    browser.launch()
    try:
        yield browser
    finally:
        browser.close()
