"""``Divergence``: the first place a target broke a property, as every property reports it."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from paracheck.check.properties.catalog import reported_property

__all__ = [
    "SCALED",
    "UNCHANGED",
    "Divergence",
    "diverge",
    "how_diverged",
    "property_of",
    "two_numbers",
]


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
    # The other tensors of the same kind and step that diverged another way (``how``), the
    # first of each way: Note [Every way a step diverged] in
    # ``paracheck.check.properties.equivalence``.
    others: tuple[Divergence, ...] = ()

    @property
    def how(self) -> str:
        """How the tensor diverged, in a word (``how_diverged``)."""
        return how_diverged(self.detail)

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


_GOT = re.compile(r"got ([-+0-9.eE]+|[-+]?inf|nan), expected ([-+0-9.eE]+|[-+]?inf|nan)")


def how_diverged(detail: str) -> str:
    """How a tensor diverged, in a word: a gradient present or absent where the oracle's is
    not, another shape, non-finite values, a parameter the step left unchanged (``UNCHANGED``),
    every element (or a parameter's update) a whole factor of the oracle's ("scaled"), a rounding (the worst element within 1e-3 of its
    expected value: a buffer of a narrower dtype) or a wrong value. Two bugs of one property in
    one row are told apart by it (a float32 buffer beside a wrong weighting, both diverging on
    a gradient)."""
    if detail.startswith(("expected no gradient", "expected a gradient")):
        return "presence"
    if detail.startswith("shape"):
        return "shape"
    if "non-finite" in detail:
        return "non-finite"
    m = _GOT.search(detail)
    if m is None:
        return ""
    try:
        got, expected = float(m.group(1)), float(m.group(2))
    except ValueError:
        return ""
    if not (math.isfinite(got) and math.isfinite(expected)):
        return "non-finite"
    if UNCHANGED in detail:
        return "unchanged"
    if SCALED in detail:
        return "scaled"
    if UPDATE_CLOSE in detail:
        return "rounding"
    if UPDATE_WRONG in detail:
        return "value"
    if abs(got - expected) <= 1e-3 * abs(expected):
        return "rounding"
    return "value"


# Note [A scaled value]
#   A sum where a mean is due (a division by the world size or the micro-step count left out),
#   or a mean divided once more, puts every element of a tensor at a whole factor k of the
#   oracle's, or at 1/k; a gradient left local, a weighting by the wrong batch sizes or a
#   dropped momentum puts it at no such ratio. So a tensor whose every element is k or 1/k
#   times its expected value (k in 2..8: worlds and micro-steps as drawn; within 1e-3 of the
#   tensor's largest expected element, or a few units of its dtype's rounding) diverged
#   "scaled" (``whole_factor`` in ``paracheck.check.properties.closeness`` says so in its
#   detail), apart from "value": two bugs of one property in one row are two causes, as a flat
#   DDP whose biases are summed beside a weight left out of its buffer. Every element, not the
#   worst one: a gradient left local on two ranks is twice the average wherever the other
#   rank's is near zero, and its worst element is often there. The factor itself is not in the
#   key: the same bug at world sizes 2 and 3 is one cause.
SCALED = "every element is"
# A parameter the step left as it was where the oracle's changed (a shard never stepped or
# never broadcast), apart from one stepped wrong (a decay applied twice): two bugs of one case.
UNCHANGED = "unchanged by the step, where the oracle's parameter changed"
# Note [A parameter's update]
#   A parameter after a step is judged by its update (from the rank's own parameter before the
#   step), not by its value: a weight decay applied twice moves a parameter by lr * wd of itself,
#   below 1e-3 of the value where lr * wd is small (a rounding, by the value) and above it where
#   not, so one bug was two causes by the drawn hyper-parameters; against the update it is a wrong
#   value in both. An update within 1e-3 of the oracle's (a gradient reduced in a narrower dtype,
#   a sum that Adam's normalisation all but cancels) is a rounding, any other a wrong value.
UPDATE_CLOSE = "its update is within 1e-3 of the oracle's"
UPDATE_WRONG = "its update is not the oracle's"
