"""The ``world-size-relation`` property (DDP targets, opt-in; needs no oracle): W ranks with equal
local batches B_0..B_{W-1} equal one rank fed their concatenation (the mean over the
concatenation is the mean of the per-rank means when the sizes are equal), so a target is checked
against itself at world size 1.

Reads rank 0's ``RankRecord`` of two runs of the target: the case with every rank's batch size
set to rank 0's, and the world-size-1 case fed all of its ranks' batches (``merged_world_case``).
Compares the synchronised ``grads`` and the ``params`` of every ``RankStep`` under the tolerance
policy (``paracheck.oracle.tolerance``): the runs differ only in summation order. Cases with a
data-dependent branch (whose use depends on which batch comes first), with parameters not all of
the case's dtype, or at world size 1 are not judged.
"""

from __future__ import annotations

from dataclasses import replace

from paracheck.cases import Case
from paracheck.check.properties._divergence import Divergence
from paracheck.check.properties._two_runs import compare_runs, one_dtype
from paracheck.check.ranks.record import RankRecord
from paracheck.world import World

__all__ = [
    "NAME",
    "check_world_size_relation",
    "merged_world_case",
    "relation_case",
    "world_size_relation",
]

NAME = "world-size-relation"


def merged_world_case(case: Case) -> Case:
    """The world-size-1 case fed all of ``case``'s ranks' batches (needs equal batch sizes and
    no data-dependent branch, whose use depends on which batch comes first)."""
    if len(set(case.batch_sizes)) != 1:
        raise ValueError(
            f"batch_sizes={case.batch_sizes} must be equal for the world-size relation"
        )
    if getattr(case.model, "unused", "none") == "data":
        raise ValueError("a data-dependent branch breaks the world-size relation (unused='data')")
    return replace(
        case,
        world_size=1,
        batch_sizes=(case.batch_sizes[0],),
        merged_ranks=case.world_size,
        rank_dependent_init=False,
    )


def relation_case(case: Case) -> Case | None:
    """``case`` with every rank's batch size set to rank 0's, or None where the relation does not
    apply to it (world size 1, a data-dependent branch, parameters not all of the case's dtype)."""
    if case.world_size < 2 or getattr(case.model, "unused", "none") == "data":
        return None
    if not one_dtype(case):
        return None
    return replace(case, batch_sizes=(case.batch_sizes[0],) * case.world_size)


def world_size_relation(
    world: World, target, case: Case, *, timeout=None, wide: list[RankRecord] | None = None
) -> Divergence | None:
    """The relation on ``case`` (equal batch sizes, no data-dependent branch); ``wide``: the run
    of ``case`` itself where it was already made."""
    job = target.job(case)
    if wide is None:
        wide = world.run(target.rank_fn, job, world_size=case.world_size, timeout=timeout)
    one = merged_world_case(case)
    narrow = world.run(target.rank_fn, replace(job, case=one), world_size=1, timeout=timeout)
    return compare_runs(
        wide, narrow, case, NAME, f"world size {case.world_size} vs 1 fed the same data"
    )


def check_world_size_relation(
    world: World, target, case: Case, ranks: list[RankRecord], *, timeout=None
) -> Divergence | None:
    """The property on a checked case (``ranks``: its run): judged on ``relation_case(case)``."""
    relation = relation_case(case)
    if relation is None:
        return None
    wide = ranks if relation == case else None
    return world_size_relation(world, target, relation, timeout=timeout, wide=wide)
