"""The request context (``gateway.upstream.exchange.Exchange``): the handler builds it once and
the steps take it instead of the request's parts one by one; ``ApiRoute.__call__`` reads
top-down in about 60 lines; control state lives on the exchange, not on ``RequestRecord``.

Read from the source (``ast``), like ``test_layout``."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from gateway.telemetry.record import RequestRecord
from gateway.upstream.exchange import Exchange

ROOT = Path(__file__).resolve().parents[2]
#: The steps below the handler that take the exchange: (module path, function), each with at
#: most ``MAX_STEP_PARAMS`` parameters (the exchange and what is its own).
STEPS = (
    ("gateway/upstream/failover.py", "open_with_failover"),
    ("gateway/upstream/continuation.py", "open_continuation"),
    ("gateway/relay/resume.py", "relay_resumable"),
    ("gateway/relay/assembled.py", "assemble_json"),
    ("gateway/account.py", "account"),
)
MAX_STEP_PARAMS = 4
MAX_CALL_LINES = 60


Function = ast.FunctionDef | ast.AsyncFunctionDef


def _function(path: str, name: str, cls: str | None = None) -> Function:
    tree = ast.parse((ROOT / path).read_text())
    scope: list[ast.stmt] = tree.body
    if cls is not None:
        (klass,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
        scope = klass.body
    (fn,) = [n for n in scope
             if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name]
    return fn


def _params(fn: Function) -> list[str]:
    a = fn.args
    return [p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs] if p.arg != "self"]


@pytest.mark.parametrize(("path", "name"), STEPS)
def test_each_step_takes_the_exchange_not_the_requests_parts(path: str, name: str) -> None:
    params = _params(_function(path, name))
    assert "ex" in params and len(params) <= MAX_STEP_PARAMS, params
    assert not {"body", "plan", "protocol", "rec", "trace", "relayed"} & set(params), params


def test_the_handler_reads_top_down() -> None:
    fn = _function("gateway/handler.py", "__call__", cls="ApiRoute")
    assert fn.end_lineno is not None and fn.end_lineno - fn.lineno + 1 <= MAX_CALL_LINES


def test_control_state_is_on_the_exchange_and_recorded_at_accounting() -> None:
    """Whether the response started steers the error path: a field of the exchange; the
    record keeps it only as a fact (``account`` copies it) and no step outside accounting
    and the console reads it from the record."""
    assert "started" in {f.name for f in dataclasses.fields(Exchange)}
    readers = []
    for path in (ROOT / "gateway").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr == "response_started"
                    and isinstance(node.value, ast.Name) and node.value.id == "rec"):
                readers.append(str(path.relative_to(ROOT)))
    assert set(readers) <= {"gateway/account.py", "gateway/console/incidents.py"}, readers
    assert "response_started" in {f.name for f in dataclasses.fields(RequestRecord)}


def test_body_and_plan_are_asked_of_the_exchange_only_once_set() -> None:
    rec = RequestRecord("r", "/v1/chat/completions")
    ex = Exchange(None, None, rec, None, None)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="body"):
        _ = ex.body
    with pytest.raises(RuntimeError, match="planned"):
        _ = ex.plan
    assert ex.attempts == [] and ex.relayed == [] and not ex.started
