"""The tree shows the architecture (layout issue): no import cycles among first-party modules
(imports under ``TYPE_CHECKING`` and inside functions included), ``engines`` never imports
``gateway``, every package names its public surface, no function outgrows 80 lines (declarative
ones listed with their reason), and the gateway's packages import only downward along the request
path (``LAYERS``).

Imports are read from the source (``ast``), not executed, so a cycle that only a type checker
or a late import would follow still counts.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "engines")
#: Lines of one function or method, ``def`` to its last line: long enough for a step of the
#: request path with its error handling, short enough to read without scrolling.
MAX_FUNCTION_LINES = 80

#: Functions allowed past ``MAX_FUNCTION_LINES`` because they declare rather than decide (one
#: statement per item, no branching to follow), ``module:qualified name`` → why.
DECLARATIVE: dict[str, str] = {
    "gateway.cli:build_parser": "the command line: one add_argument per flag of each subcommand",
    "gateway.telemetry.metrics:GatewayMetrics.__init__": "the Prometheus metric declarations, one"
    " constructor call (name, help, labels, buckets) per metric",
}

#: Functions over the cap that another branch splits (``module:qualified name`` → owner and
#: what replaces it). Temporary: emptied when those branches merge.
BEING_SPLIT: dict[str, str] = {}

#: The gateway's packages (and top-level modules) bottom up, along the request path: each may
#: import those on its own layer or below, never one above. Shared nouns sit under the steps:
#: config, errors and the common helpers (the SSE wire format among them), then the fleet
#: (pools, replicas, outlier state, retry budgets); then the steps in request order.
LAYERS: tuple[frozenset[str], ...] = tuple(frozenset(layer.split()) for layer in (
    "config errors common asgi capacity",
    "fleet",
    "routing telemetry",
    "plan",
    "protocols",
    "upstream",
    "admit",
    "relay",
    "account handler state console",
    "app routes picker",
    "server",
    "demo",
    "cli",
    "__main__",
))

#: Imports against ``LAYERS`` that are allowed, (importer, imported) package pairs, with why.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {
    ("fleet", "routing"): "type-only (TYPE_CHECKING): a pool carries the router that routing sets"
    " on it at startup, and the router's protocol (fleet.pools.ReplicaRouter) names the"
    " routing key and store types it is called with",
}


def _modules() -> dict[str, Path]:
    """Dotted module name → file, for every first-party module."""
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """First-party modules ``name`` imports anywhere in its source (``from a.b import c``
    counts ``a.b.c`` when that is a module, else ``a.b``)."""
    found: set[str] = set()
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor if is_pkg else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for a in node.names:
                sub = f"{base}.{a.name}"
                if sub in modules:
                    found.add(sub)
                elif base in modules:
                    found.add(base)
    found.discard(name)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles_type_only_ones_included() -> None:
    assert _cycles(_graph()) == []


def test_cycle_detector_sees_a_type_only_cycle(tmp_path: Path) -> None:
    """The checker itself: a cycle closed only under ``TYPE_CHECKING`` is found."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    src = tmp_path / "m.py"
    src.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from x.y import Z\n")
    assert _imports("x.m", src, {"x.y": src, "x.m": src}) == {"x.y"}


def test_engines_never_import_gateway() -> None:
    bad = {m: sorted(i for i in deps if i.split(".")[0] == "gateway")
           for m, deps in _graph().items() if m.split(".")[0] == "engines"}
    assert {m: d for m, d in bad.items() if d} == {}


def test_every_package_names_its_public_surface() -> None:
    missing = []
    for pkg in PACKAGES:
        for init in (ROOT / pkg).rglob("__init__.py"):
            doc = ast.get_docstring(ast.parse(init.read_text()))
            if not doc or len(doc) < 40:
                missing.append(init.relative_to(ROOT).as_posix())
    assert missing == []


def _function_lengths(module: str, path: Path) -> dict[str, int]:
    """``module:Class.method`` (nested functions as ``outer.inner``) → its lines, ``def`` to
    its last line, for every function in ``path``."""
    out: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = prefix + child.name
                out[f"{module}:{name}"] = (child.end_lineno or child.lineno) - child.lineno + 1
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(), str(path)), "")
    return out


def _long_functions() -> dict[str, int]:
    return {name: n for mod, path in _modules().items()
            for name, n in _function_lengths(mod, path).items() if n > MAX_FUNCTION_LINES}


def test_no_function_over_80_lines() -> None:
    """Every function fits ``MAX_FUNCTION_LINES``, but the declarative ones and those another
    branch is splitting; every entry of those lists is still a long function (a stale one is
    removed)."""
    long = _long_functions()
    listed = DECLARATIVE.keys() | BEING_SPLIT.keys()
    assert {name: n for name, n in long.items() if name not in listed} == {}
    assert sorted(listed - long.keys()) == []


def test_function_lengths_name_methods_and_nested_functions(tmp_path: Path) -> None:
    """The checker itself: a method is named by its class, a nested function by its outer one,
    and a length counts from ``def`` to the last line."""
    src = tmp_path / "m.py"
    src.write_text("class A:\n    def f(self):\n        def g():\n            pass\n"
                   "        return g\n\nasync def h():\n    pass\n")
    assert _function_lengths("x.m", src) == {"x.m:A.f": 4, "x.m:A.f.g": 2, "x.m:h": 2}


def _layer_of(module: str) -> tuple[str, int] | None:
    """``gateway.x.y`` → (``x``, its layer index); None outside ``gateway`` or for the package
    root itself."""
    parts = module.split(".")
    if parts[0] != "gateway" or len(parts) < 2:
        return None
    for i, layer in enumerate(LAYERS):
        if parts[1] in layer:
            return parts[1], i
    raise AssertionError(f"{module}: gateway.{parts[1]} is on no layer of LAYERS")


def _upward(graph: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """Package pairs (importer, imported) whose import runs up ``LAYERS``, with the modules."""
    out: dict[tuple[str, str], list[str]] = {}
    for mod, deps in graph.items():
        src = _layer_of(mod)
        for dep in deps:
            dst = _layer_of(dep)
            if src is not None and dst is not None and dst[1] > src[1]:
                out.setdefault((src[0], dst[0]), []).append(f"{mod} -> {dep}")
    return out


def test_gateway_imports_follow_the_request_path() -> None:
    """No package imports one above it in ``LAYERS`` (``ALLOWED_UPWARD`` excepted: at most one
    pair, each with its reason)."""
    assert len(ALLOWED_UPWARD) <= 1
    bad = {pair: sorted(mods) for pair, mods in _upward(_graph()).items()
           if pair not in ALLOWED_UPWARD}
    assert bad == {}


def test_layer_check_sees_an_upward_import() -> None:
    """The checker itself: an import from a lower layer to a higher one is reported, a
    downward one is not, and a package on no layer fails loudly."""
    graph = {"gateway.fleet.pools": {"gateway.relay.stream", "gateway.config"},
             "gateway.relay.stream": {"gateway.fleet.pools"}}
    assert _upward(graph) == {("fleet", "relay"): ["gateway.fleet.pools -> gateway.relay.stream"]}
    with pytest.raises(AssertionError, match=r"gateway\.nowhere"):
        _upward({"gateway.nowhere": {"gateway.config"}})
