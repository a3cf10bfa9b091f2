"""The ``bucket-size-independence`` property (DDP targets that take ``bucket_size_mb``, opt-in;
needs no oracle): a bucketed target's result does not depend on its bucket size.

Reads rank 0's ``RankRecord`` of the case and of the same case with ``bucket_size_mb`` =
``OTHER_BUCKET_MB`` (one big bucket for every model the cases draw). Compares the synchronised
``grads`` and the ``params`` of every ``RankStep`` under the tolerance policy
(``paracheck.oracle.tolerance``): the runs differ only in how the sums are grouped. Cases with an
unbounded bucket (``bucket_size_mb=None``) or parameters not all of the case's dtype (float32 sums
grouped by other buckets round differently, beyond the float64 tolerance) are not judged.
"""

from __future__ import annotations

from dataclasses import replace

from paracheck.cases import Case
from paracheck.check.properties._divergence import Divergence
from paracheck.check.properties._two_runs import compare_runs, one_dtype
from paracheck.check.ranks.record import RankRecord
from paracheck.world import World

__all__ = ["NAME", "OTHER_BUCKET_MB", "bucket_size_independence", "check_bucket_size_independence"]

NAME = "bucket-size-independence"
OTHER_BUCKET_MB = 1000.0


def bucket_size_independence(
    world: World,
    target,
    case: Case,
    other_bucket_mb: float,
    *,
    timeout=None,
    first: list[RankRecord] | None = None,
) -> Divergence | None:
    """``case`` against the same case at ``other_bucket_mb``; ``first``: the run of ``case`` itself
    where it was already made."""
    job = replace(target.job(case), takes_bucket=True)
    if first is None:
        first = world.run(target.rank_fn, job, world_size=case.world_size, timeout=timeout)
    other = replace(case, bucket_size_mb=other_bucket_mb)
    second = world.run(
        target.rank_fn, replace(job, case=other), world_size=case.world_size, timeout=timeout
    )
    mb = case.bucket_mb
    return compare_runs(first, second, case, NAME, f"bucket_size_mb {mb:g} vs {other_bucket_mb:g}")


def check_bucket_size_independence(
    world: World, target, case: Case, ranks: list[RankRecord], *, timeout=None
) -> Divergence | None:
    """The property on a checked case (``ranks``: its run)."""
    if case.unbounded_bucket or not one_dtype(case):
        return None
    return bucket_size_independence(
        world, target, case, OTHER_BUCKET_MB, timeout=timeout, first=ranks
    )
