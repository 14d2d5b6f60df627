"""The real-vLLM integration suite: one standard and one ngram-speculative vLLM server plus a
gateway, started once for the whole package (~40 s with a cached venv and model).

Marker ``vllm`` (``pytest -m vllm`` runs only this suite, ``-m 'not vllm'`` skips it). When vLLM
cannot be installed or started the fixture raises: every test errors, the run fails.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from tests.integration_vllm.stack import VllmStack


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "vllm: starts real vLLM servers (CPU build, tiny local model) and a gateway"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "integration_vllm" in item.nodeid:
            item.add_marker(pytest.mark.vllm)


@pytest.fixture(scope="package")
def vllm_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmStack]:
    s = VllmStack(tmp_path_factory.mktemp("vllm")).start()
    print(f"\nvLLM stack up: {s.startup_s}", file=sys.stderr)
    try:
        yield s
    finally:
        s.stop()
