"""A catalogue of deliberately broken implementations that paracheck's properties must catch.

Each entry is a realistic bug, importable like any user target. ``paracheck selftest`` checks
every one and reports whether it was killed, after how many examples, and the shrunk case.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Mutant", "MUTANTS", "register"]


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # "package.module:Class", checked like a user target
    kind: str  # "ddp" | "sharded" | "zero"
    bug: str  # one sentence: what is wrong
    expect: str = "diverge"  # "diverge" | "hang" | "raise": how the check should catch it


MUTANTS: dict[str, Mutant] = {}


def register(name: str, path: str, kind: str, bug: str, expect: str = "diverge") -> None:
    if name in MUTANTS:
        raise ValueError(f"mutant name={name!r} is registered twice")
    MUTANTS[name] = Mutant(name, path, kind, bug, expect)


register("ddp-no-divide", "paracheck.mutants.ddp:NoDivideDDP", "ddp",
         "gradients are summed over ranks but never divided by the world size")

# Further catalogues register themselves on import.
from paracheck.mutants import ddp as _ddp  # noqa: E402,F401

try:  # later catalogues (sharding, ...) are optional until they land
    from paracheck.mutants import sharding as _sharding  # noqa: F401
except ImportError:
    pass
