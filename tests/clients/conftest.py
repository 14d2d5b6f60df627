"""The SDK matrix: one stack per module, and the table of results. Every test here is named
``test_<sdk>__<case>``; with ``SPEEDGATE_MATRIX_OUT=path`` set, the session writes a markdown
table (one row per SDK, one column per case: pass / FAIL / skip) to that path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.agents.conftest import agents, stack  # noqa: F401  (npm installs; one stack a module)

RESULTS: dict[str, dict[str, str]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    name = report.nodeid.rsplit("::", 1)[-1]
    if "__" not in name or not (report.when == "call" or not report.passed):
        return  # the call's outcome, or a setup/teardown that skipped or failed
    sdk, case = name.removeprefix("test_").split("__", 1)
    cell = "pass" if report.passed else "skip" if report.skipped else "FAIL"
    row = RESULTS.setdefault(sdk, {})
    if row.get(case) != "FAIL":  # a failed setup or call stays failed
        row[case] = cell


def matrix_table(results: dict[str, dict[str, str]]) -> str:
    """The results as a markdown table: SDKs as rows, cases as columns (first-seen order)."""
    cases = list(dict.fromkeys(c for row in results.values() for c in row))
    lines = ["| SDK | " + " | ".join(c.replace("_", " ") for c in cases) + " |",
             "| --- |" + " --- |" * len(cases)]
    for sdk, row in results.items():
        lines.append(f"| {sdk.replace('_', ' ')} | "
                     + " | ".join(row.get(c, "n/a") for c in cases) + " |")
    return "\n".join(lines) + "\n"


def pytest_sessionfinish(session: pytest.Session) -> None:
    out = os.environ.get("SPEEDGATE_MATRIX_OUT")
    if out and RESULTS:
        Path(out).write_text(matrix_table(RESULTS))
