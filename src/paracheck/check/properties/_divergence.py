"""``Divergence``: the first place a target broke a property, as every property reports it."""

from __future__ import annotations

from dataclasses import dataclass

from paracheck.check.properties.catalog import reported_property

__all__ = ["Divergence", "diverge", "property_of", "two_numbers"]


@dataclass
class Divergence:
    """The first place a target left the oracle (or ranks disagreed)."""

    step: int  # -1: initial state after construction
    what: str  # "param" | "grad" | "state" | "buffer" | "rank-agreement" | "structure", or a
    #            sharding property ("memory", "balance", "traffic", ...)
    rank: int
    index: int | None
    name: str | None
    max_abs_diff: float
    tolerance: float
    detail: str = ""
    worst_ratio: float = float("inf")

    @property
    def property(self) -> str:
        """The property this divergence breaks (a key of ``paracheck.check.report.PROPERTIES``)."""
        return property_of(self.what, self.step)

    def describe(self) -> str:
        where = "after construction" if self.step < 0 else f"at step {self.step}"
        if self.name is None:
            tensor = ""
        elif self.index is None:  # a buffer: not a parameter
            tensor = f" {self.name!r}"
        else:
            tensor = f" {self.name!r} (parameter #{self.index})"
        diff, allowed = two_numbers(self.max_abs_diff, self.tolerance, least=4)
        return (
            f"{self.what}{tensor} on rank {self.rank} {where}: max |got - expected| = "
            f"{diff}, largest allowed {allowed}. {self.detail}"
        ).rstrip()


def two_numbers(a: float, b: float, least: int = 7) -> tuple[str, str]:
    """``a`` and ``b`` in scientific notation with ``least`` significant digits, or as many more
    as it takes to print them differently where they differ (17 tell any two float64 apart): a
    got and an expected value printed alike beside a difference would read as no difference."""
    for digits in range(least, 18):
        x, y = f"{a:.{digits - 1}e}", f"{b:.{digits - 1}e}"
        if x != y or not a != b:
            break
    return x, y


def property_of(what: str, step: int) -> str:
    """The property a divergence of ``what`` at ``step`` breaks, as the property catalog says
    (``Property.reported_as`` in ``paracheck.check.properties.catalog``)."""
    return reported_property(what, step)


def diverge(step, what, rank, detail, got=0.0, expected=0.0, index=None, name=None) -> Divergence:
    return Divergence(step, what, rank, index, name, abs(float(got) - float(expected)), 0.0, detail)
