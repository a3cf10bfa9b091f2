"""Every exception class paracheck defines derives from ``paracheck.errors.ParacheckError``, is
importable from ``paracheck.errors`` and from where it was defined before, and keeps the builtin
base its callers catch it by (reference: ``paracheck.errors``)."""

import ast
import importlib
from pathlib import Path

import pytest

import paracheck
import paracheck.errors as errors

# Where each was importable before the errors module, and the builtin it is caught as.
BEFORE = {
    "TargetError": ("paracheck.check.targets", ValueError),
    "ExitAtImport": ("paracheck.check.targets", Exception),
    "ImportTimeout": ("paracheck.check.targets", Exception),
    "FeatureError": ("paracheck.check.features", ValueError),
    "InvalidArgument": ("paracheck.check.plan", ValueError),
    "UsageError": ("paracheck.cli._common", Exception),
    "GateError": ("paracheck.gate.run", RuntimeError),
    "VendorError": ("paracheck.report.history", RuntimeError),
    "CheckFailure": ("paracheck.check.run", AssertionError),
    "WorldError": ("paracheck.world", Exception),
    "WorldStartError": ("paracheck.world.runner", RuntimeError),
    "RankError": ("paracheck.world", Exception),
    "RankHang": ("paracheck.world", Exception),
    "RankDied": ("paracheck.world", Exception),
    "RankOverMemory": ("paracheck.world.runner", Exception),
    "PeerFailed": ("paracheck.world", RuntimeError),
    "Interrupted": ("paracheck.world._agent", RuntimeError),
    "PoolLost": ("paracheck.world.attached", RuntimeError),
}


def _defined_exceptions() -> set[str]:
    """The public classes in ``src/paracheck`` whose bases name an exception (read with ast).
    ``Terminated``, a KeyboardInterrupt raised for SIGTERM, is an interruption, not an error."""
    root = Path(paracheck.__file__).parent
    builtins = {
        n
        for n, v in vars(__import__("builtins")).items()
        if isinstance(v, type) and issubclass(v, Exception)
    }
    known = builtins | set(BEFORE) | {"ParacheckError"}
    found = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                bases = {ast.unparse(b).rpartition(".")[2] for b in node.bases}
                if bases & known:
                    found.add(node.name)
    return found - {"ParacheckError"}


def test_every_exception_class_is_listed():
    """The errors module lists every exception class the package defines (a new one is added
    to ``paracheck.errors.__all__`` and to this test)."""
    assert _defined_exceptions() == set(BEFORE)
    assert set(errors.__all__) == {"ParacheckError", *BEFORE}


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_exception_derives_from_the_base_and_its_builtin(name):
    """Importable from paracheck.errors and from where it was, one class, caught both ways."""
    where, builtin = BEFORE[name]
    cls = getattr(errors, name)
    assert getattr(importlib.import_module(where), name) is cls
    assert issubclass(cls, errors.ParacheckError) and issubclass(cls, builtin)
