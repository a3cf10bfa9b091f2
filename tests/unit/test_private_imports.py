"""Private names taken across modules stay few: a name another module imports is part of its
module's interface, and is named as such (no leading underscore). The bound is the count at
which the package stands, with a little room; the reader is shown to find a planted import."""

from __future__ import annotations

import ast
import pathlib

SRC = pathlib.Path(__file__).resolve().parents[2] / "src"
# At most this many ``from paracheck... import _name`` (or relative) imports of a private name
# across all of ``src/paracheck``.
MOST_PRIVATE_IMPORTS = 30


def private_imports(path: pathlib.Path) -> list[tuple[str, str]]:
    """The (module, name) pairs of private names ``path`` imports from another paracheck module:
    at any depth (a function's lazy import counts), type-only imports included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.ImportFrom):
            continue
        module = node.module or ""
        if node.level == 0 and not module.startswith("paracheck"):
            continue
        for alias in node.names:
            if alias.name.startswith("_") and not alias.name.startswith("__"):
                found.append((module, alias.name))
    return found


def test_few_private_names_cross_modules():
    rows = [
        (str(path.relative_to(SRC)), module, name)
        for path in sorted((SRC / "paracheck").rglob("*.py"))
        for module, name in private_imports(path)
    ]
    listing = "\n".join(" ".join(row) for row in rows)
    assert len(rows) <= MOST_PRIVATE_IMPORTS, (
        f"{len(rows)} private names imported across modules (at most {MOST_PRIVATE_IMPORTS}); "
        f"make the ones another module needs public:\n{listing}"
    )


def test_a_private_import_is_found(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text(
        "from paracheck.world._rank import _serve, public\n"
        "from os import _exit\n"
        "def f():\n"
        "    from .sibling import _helper\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from paracheck.cases import _Hidden\n"
    )
    assert private_imports(planted) == [
        ("paracheck.world._rank", "_serve"),
        ("sibling", "_helper"),
        ("paracheck.cases", "_Hidden"),
    ]
