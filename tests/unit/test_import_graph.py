"""No import circle in ``src/paracheck``: read from the source with ``ast``, never by importing.

Two graphs, each required to have no cycle: every import statement (at module level, inside a
function, where a lazy import only hides a circle, or under ``if TYPE_CHECKING:``, where a
type-only import hides one from the interpreter but not from a reader or a type checker), edges
going to the module named; and the module-level imports as Python runs them, where importing
``a.b.c`` first runs the packages ``a`` and ``a.b`` (a module's own packages are already running
and do not count), type-only imports left out (they never run).
"""

from __future__ import annotations

import ast
from pathlib import Path

import paracheck

ROOT = Path(paracheck.__file__).parent


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _known(name: str) -> str | None:
    """``name``, or the nearest package of it, that is a module of paracheck."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _statements(tree: ast.Module, *, nested: bool):
    """The import statements of ``tree``: every one, type-only ones included (``nested``), or
    those that run when the module is imported."""

    def walk(nodes):
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                yield from walk(node.body if nested else node.orelse)
                if nested:
                    yield from walk(node.orelse)
                continue
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                yield node
                continue
            if not nested and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if not nested and isinstance(node, ast.ClassDef):
                yield from walk(node.body)
                continue
            yield from walk(ast.iter_child_nodes(node))

    yield from walk(tree.body)


def _imported(name: str, path: Path, *, nested: bool) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    named = set()
    for node in _statements(ast.parse(path.read_text()), nested=nested):
        if isinstance(node, ast.Import):
            named |= {a.name for a in node.names}
            continue
        base = node.module or ""
        if node.level:
            up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            base = ".".join(up + ([node.module] if node.module else []))
        for a in node.names:  # ``from pkg import mod`` imports the module mod
            named.add(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base)
    out = {m for m in map(_known, named) if m is not None and m != name}
    if not nested:  # importing a.b.c runs a and a.b first, except the importer's own packages
        for m in list(out):
            parts = m.split(".")
            for i in range(1, len(parts)):
                pkg = ".".join(parts[:i])
                if pkg in MODULES and not name.startswith(pkg + "."):
                    out.add(pkg)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(_one_cycle(graph, set(component)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _one_cycle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    start = min(component)
    path, seen = [start], {start}
    while True:
        here = path[-1]
        nxt = sorted(graph[here] & component)
        if start in nxt and len(path) > 1:
            return [*path, start]
        step = next((n for n in nxt if n not in seen), None)
        if step is None:  # a dead end inside the component: the first edge back to the path
            back = next(n for n in nxt if n in seen)
            return [*path[path.index(back) :], back]
        path.append(step)
        seen.add(step)


def _describe(cycles) -> str:
    return "; ".join(" -> ".join(c) for c in cycles)


def test_graph_reads_the_source():
    """The reading sees the imports the package is known to have (a graph with no edges has no
    cycle either)."""
    graph = {n: _imported(n, p, nested=True) for n, p in MODULES.items()}
    assert "paracheck.check.loading" in graph["paracheck.check.targets"]
    assert "paracheck.check.interfaces" in graph["paracheck.check.ranks._drive"]
    assert "paracheck.check.properties.memory" not in graph["paracheck.check.kinds"]  # by string
    # A lazy import (inside a function) is an edge of the first graph only.
    assert "paracheck.check.property" in graph["paracheck.cli.check"]
    top = {n: _imported(n, p, nested=False) for n, p in MODULES.items()}
    assert "paracheck.check.property" not in top["paracheck.cli.check"]
    # from paracheck.accounting.traffic import ...: the package runs first.
    assert "paracheck.accounting" in top["paracheck.check.ranks._common"]


def test_a_type_only_import_is_an_edge_of_the_first_graph_only(tmp_path):
    """An import under ``if TYPE_CHECKING:`` is read as an edge of every import, never of those
    that run; its ``else:`` branch runs."""
    path = tmp_path / "typed.py"
    path.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from paracheck.errors import UsageError\n"
        "else:\n"
        "    from paracheck.oracle.exact import exact_mean\n"
    )
    every = _imported("paracheck.typed", path, nested=True)
    assert every == {"paracheck.errors", "paracheck.oracle.exact"}
    assert _imported("paracheck.typed", path, nested=False) == {
        "paracheck.oracle",
        "paracheck.oracle.exact",
    }


def test_errors_module_is_a_leaf():
    """``paracheck.errors`` imports no module of paracheck, not even for type checking: every
    module may import it, so anything it imported would close a circle."""
    assert _imported("paracheck.errors", MODULES["paracheck.errors"], nested=True) == set()


def test_no_import_circle_among_all_imports():
    """No module imports, at any depth of its code, a module that imports it back."""
    graph = {n: _imported(n, p, nested=True) for n, p in MODULES.items()}
    cycles = _cycles(graph)
    assert not cycles, f"import circles: {_describe(cycles)}"


def test_no_import_circle_among_module_level_imports():
    """Importing any module never re-enters one that is still running its top level."""
    graph = {n: _imported(n, p, nested=False) for n, p in MODULES.items()}
    cycles = _cycles(graph)
    assert not cycles, f"import circles: {_describe(cycles)}"


def test_a_circle_is_found():
    """The cycle search finds a planted circle and names it."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
