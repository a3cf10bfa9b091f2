"""Which reading of Note [A parameter no rank reached] (``paracheck.oracle.train``) a target
followed: the oracle's trajectory the equivalence family judges it against, where a parameter no
rank reached may be stepped with its zero gradient or skipped, step by step."""

from __future__ import annotations

from collections.abc import Callable

from paracheck.check.properties._divergence import Divergence
from paracheck.check.properties.state import check_state
from paracheck.check.ranks.record import RankRecord
from paracheck.oracle import Trajectory

__all__ = ["MAX_READINGS", "on_its_reading", "state_union"]

# The most oracle trainings ``on_its_reading`` spends on one case beyond the first: each choice of
# Note [A parameter no rank reached] that a divergence leaves open costs one.
MAX_READINGS = 32


def on_its_reading(
    traj: Trajectory,
    judge: Callable[[Trajectory], tuple[Divergence | None, float]],
    skipping: Callable[[frozenset[tuple[int, int]]], Trajectory],
    *,
    union: Callable[[Trajectory], Divergence | None] | None = None,
) -> tuple[Trajectory, Divergence | None, float]:
    """The oracle's trajectory of the choices the target made at each parameter no rank reached
    (Note [A parameter no rank reached] in ``paracheck.oracle.train``), with ``judge``'s verdict on
    it. ``traj`` steps every such parameter; ``skipping(pairs)`` is the same oracle skipping the
    given (step, parameter) pairs. A trajectory matches where neither ``judge`` nor ``union``
    (the optimizer state's union over ranks: a skipped parameter has none) finds a divergence;
    the earlier of theirs is its first. The choices are searched in step order, depth first,
    stepping before skipping: the first pair left open at or before the first divergence's step
    is decided both ways, and a set of choices is dropped where it diverges at a step whose every
    pair is decided (nothing later can change that step). Returns the first trajectory that
    matches, else the one that diverged latest (the earliest found at a tie: ``traj`` where no
    choice helps), after at most ``MAX_READINGS`` further trainings."""
    budget = MAX_READINGS
    best: tuple[int, Trajectory, Divergence | None, float] | None = None
    Found = tuple[Trajectory, Divergence | None, float]

    def verdict(t: Trajectory) -> tuple[Divergence | None, Divergence | None, float]:
        div, worst = judge(t)
        other = union(t) if union is not None else None
        first = min((d for d in (div, other) if d is not None), key=lambda d: d.step, default=None)
        return first, div, worst

    def visit(t: Trajectory, seen, decided) -> Found | None:
        nonlocal best, budget
        first, div, worst = seen
        if first is None:
            return t, div, worst
        if best is None or first.step > best[0]:
            best = (first.step, t, div, worst)
        open_ = [
            (k, i)
            for k, s in enumerate(t.steps[: first.step + 1])
            for i in getattr(s, "unreached", ())
            if (k, i) not in decided
        ]
        if not open_:
            return None
        pair = open_[0]
        found = visit(t, seen, decided | {pair})  # stepped: the trajectory it already is
        if found is not None or budget <= 0:
            return found
        budget -= 1
        other = skipping(t.skipped_unreached | {pair})
        return visit(other, verdict(other), decided | {pair})

    found = visit(traj, verdict(traj), frozenset())
    if found is not None:
        return found
    assert best is not None  # the first verdict diverged
    return best[1:]


def state_union(
    case, ranks: list[RankRecord], props, world, compares_state: bool
) -> Callable[[Trajectory], Divergence | None] | None:
    """The ``state`` property's check of a trajectory (every parameter's state on some rank, the
    union equal to the oracle's: ``check_state``), for ``on_its_reading``'s ``union``; None where
    the kind compares no state or ``state`` is not checked."""
    if not compares_state or "state" not in props:
        return None
    same = getattr(world, "backend", "gloo") != "nccl"  # as the state property judges it
    return lambda traj: check_state(case, traj, ranks, props, same_operations=same)
