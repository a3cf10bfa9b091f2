"""Which reading of Note [A parameter no rank reached] (``paracheck.oracle.train``) a target
followed: the oracle's trajectory the equivalence family judges it against, where a parameter no
rank reached may be stepped with its zero gradient or skipped, step by step."""

from __future__ import annotations

from collections.abc import Callable

from paracheck.check.properties._divergence import Divergence
from paracheck.oracle import Trajectory

__all__ = ["MAX_READINGS", "on_its_reading"]

# The most oracle trainings ``on_its_reading`` spends on one case beyond the first: each choice of
# Note [A parameter no rank reached] that a divergence leaves open costs one.
MAX_READINGS = 32


def on_its_reading(
    traj: Trajectory,
    judge: Callable[[Trajectory], tuple[Divergence | None, float]],
    skipping: Callable[[frozenset[tuple[int, int]]], Trajectory],
) -> tuple[Trajectory, Divergence | None, float]:
    """The oracle's trajectory of the choices the target made at each parameter no rank reached
    (Note [A parameter no rank reached] in ``paracheck.oracle.train``), with ``judge``'s verdict on
    it. ``traj`` steps every such parameter; ``skipping(pairs)`` is the same oracle skipping the
    given (step, parameter) pairs. The choices are searched in step order, depth first, stepping
    before skipping: the first pair left open at or before a divergence's step is decided both
    ways, and a set of choices is dropped where it diverges at a step whose every pair is decided
    (nothing later can change that step). Returns the first trajectory that matches, else the one
    that diverged latest (the earliest found at a tie: ``traj`` where no choice helps), after at
    most ``MAX_READINGS`` further trainings."""
    budget = MAX_READINGS
    best: tuple[Trajectory, Divergence, float] | None = None
    Found = tuple[Trajectory, Divergence | None, float]

    def visit(t: Trajectory, verdict: tuple[Divergence | None, float], decided) -> Found | None:
        nonlocal best, budget
        div, worst = verdict
        if div is None:
            return t, None, worst
        if best is None or div.step > best[1].step:
            best = (t, div, worst)
        open_ = [
            (k, i)
            for k, s in enumerate(t.steps[: div.step + 1])
            for i in getattr(s, "unreached", ())
            if (k, i) not in decided
        ]
        if not open_:
            return None
        pair = open_[0]
        found = visit(t, verdict, decided | {pair})  # stepped: the trajectory it already is
        if found is not None or budget <= 0:
            return found
        budget -= 1
        other = skipping(t.skipped_unreached | {pair})
        return visit(other, judge(other), decided | {pair})

    found = visit(traj, judge(traj), frozenset())
    if found is not None:
        return found
    assert best is not None  # the first verdict diverged
    return best
