"""The World and its pool stay apart (reference: ``paracheck.world._pool``): no class of
``paracheck.world`` overrides a private method of another, and the job collection and its watch
(``_collect``, ``_watch``) reach the World's ranks through public names only. Read from the
source with ``ast``, never by importing."""

from __future__ import annotations

import ast
from pathlib import Path

import paracheck.world

WORLD = Path(paracheck.world.__file__).parent
# The modules that judge a job; everything they read of a rank comes through the pool's methods.
JUDGES = ("_collect.py", "_watch.py")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _classes(sources: dict[str, str]) -> dict[str, ast.ClassDef]:
    return {
        node.name: node
        for text in sources.values()
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.ClassDef)
    }


def _methods(cls: ast.ClassDef) -> set[str]:
    return {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def private_overrides(sources: dict[str, str]) -> list[str]:
    """``Class.method`` for each private method a class defines again over a base class that is
    defined in ``sources`` (file name -> source text), through any depth of bases."""
    classes = _classes(sources)
    found = []
    for name, cls in classes.items():
        bases = [ast.unparse(b).rpartition(".")[2] for b in cls.bases]
        seen: set[str] = set()
        while bases:
            base = bases.pop()
            if base in seen or base not in classes:
                continue
            seen.add(base)
            shared = {m for m in _methods(cls) & _methods(classes[base]) if _private(m)}
            found += [f"{name}.{m} (over {base})" for m in sorted(shared)]
            bases += [ast.unparse(b).rpartition(".")[2] for b in classes[base].bases]
    return sorted(found)


def foreign_private_names(text: str) -> list[str]:
    """The private names a module's source ``text`` takes from elsewhere: imported from another
    module, or read or written as an attribute of anything but ``self``."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom):
            found += [f"import {a.name}" for a in node.names if _private(a.name)]
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            owner = node.value
            if not (isinstance(owner, ast.Name) and owner.id == "self"):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def _world_sources() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(WORLD.glob("*.py"))}


def test_no_private_method_is_overridden_across_classes():
    """No class of ``paracheck.world`` defines again a private method of a base class there: a
    pool is told apart by the ``Pool`` interface, not by a subclass that reaches into its base."""
    assert private_overrides(_world_sources()) == []


def test_the_collection_and_the_watch_use_public_names_only():
    """``_collect`` and ``_watch`` import no private name and touch no private attribute of
    another object: what they read of a rank is the pool's public interface."""
    found = {name: foreign_private_names(_world_sources()[name]) for name in JUDGES}
    assert found == {name: [] for name in JUDGES}


def test_a_planted_override_and_a_planted_private_read_are_found():
    """The readings above find what they forbid: a subclass that overrides its base's private
    method (directly and through a middle class), and a module that imports a private name,
    reads another object's private field and writes one."""
    sources = {
        "a.py": "class World:\n    def _start(self): ...\n    def run(self): ...\n",
        "b.py": (
            "from a import World\n"
            "class Attached(World):\n    def _start(self): ...\n    def run(self): ...\n"
            "class Deeper(Attached):\n    pass\n"
            "class Deepest(Deeper):\n    def _start(self): ...\n    def __init__(self): ...\n"
        ),
    }
    assert private_overrides(sources) == [
        "Attached._start (over World)",
        "Deepest._start (over Attached)",
        "Deepest._start (over World)",
    ]
    text = (
        "from x import _hidden, shown\n"
        "def f(world):\n    world._generation += 1\n    return world._conns, world.pool\n"
        "class C:\n    def g(self):\n        return self._own, self.pool._procs\n"
    )
    assert foreign_private_names(text) == [
        "import _hidden",
        "line 3: world._generation",
        "line 4: world._conns",
        "line 7: self.pool._procs",
    ]
