"""The Node SDKs through the gateway over simulated replicas: ``openai``, ``@anthropic-ai/sdk``
and Vercel's ``ai`` with ``@ai-sdk/openai`` (chat and Responses providers), each plain,
streamed, on the fast tier, with usage, a tool round trip and a typed error. One ``node`` run
(``node_matrix.mjs``) checks every cell; each cell is one test here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.agents.install import Agents
from tests.e2e.stack import MODEL, Stack

# the first run may install the pinned npm packages (under a minute; .ci/run does it first)
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
SCRIPT = Path(__file__).with_name("node_matrix.mjs")
CASES = ("plain", "stream", "fast_tier", "usage", "tool_round_trip", "typed_error")
SDKS = ("node_openai", "node_anthropic", "vercel_ai_chat", "vercel_ai_responses")


@pytest.fixture(scope="module")
def node_results(agents: Agents, stack: Stack) -> dict[str, dict[str, str]]:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    done = subprocess.run([node, str(SCRIPT), stack.base_url, MODEL], capture_output=True,
                          text=True, timeout=120,
                          env={**os.environ, "NODE_PATH": str(agents.node_modules)})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _cell(sdk: str, case: str) -> Callable[[dict[str, dict[str, str]]], None]:
    def test(node_results: dict[str, dict[str, str]]) -> None:
        assert node_results[sdk][case] == "pass"

    test.__name__ = f"test_{sdk}__{case}"
    test.__doc__ = f"{sdk}: {case.replace('_', ' ')} (node_matrix.mjs)."
    return test


for _sdk in SDKS:
    for _case in CASES:
        globals()[f"test_{_sdk}__{_case}"] = _cell(_sdk, _case)
