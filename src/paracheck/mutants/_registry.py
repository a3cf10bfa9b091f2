"""The catalogue's registry: every mutant module registers its entries here on import."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Mutant", "MUTANTS", "register"]


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # "package.module:Class", checked like a user target
    kind: str  # a kind of paracheck.check.kinds.KINDS
    bug: str  # one sentence: what is wrong
    expect: str = "diverge"  # "diverge" | "hang" | "raise": how the check should catch it
    # The properties that kill it (None: the kind's default): a bug in a reading of the interface
    # that a default property accepts is caught by an opt-in one.
    properties: tuple[str, ...] | None = None
    # The precision its cases are drawn in (None: the selftest's dtype): a bug that shows only
    # below float32.
    precision: str | None = None


MUTANTS: dict[str, Mutant] = {}


def register(
    name: str,
    path: str,
    kind: str,
    bug: str,
    expect: str = "diverge",
    properties=None,
    precision: str | None = None,
) -> None:
    if name in MUTANTS:
        raise ValueError(f"mutant name={name!r} is registered twice")
    MUTANTS[name] = Mutant(
        name, path, kind, bug, expect, None if properties is None else tuple(properties), precision
    )
