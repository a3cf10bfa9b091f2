"""Properties that need no oracle: two runs of the *same target* that must agree.

* world-size relation: W ranks with equal local batches B_0..B_{W-1} equal one rank fed their
  concatenation (the mean over the concatenation is the mean of the per-rank means when the
  sizes are equal), so a target can be checked against itself at world size 1;
* bucket-size independence: a bucketed target's result must not depend on ``bucket_size_mb``.

Both compare rank 0's synchronised gradients and parameters after every step under the same
tolerance policy as the oracle check (``paracheck.oracle.tolerance``): the runs differ only in
summation order.
"""

from __future__ import annotations

from dataclasses import replace

from paracheck.cases import Case
from paracheck.check.compare import Divergence, _close
from paracheck.check.run import param_names
from paracheck.check.targets import Target
from paracheck.oracle.tolerance import tolerance_for
from paracheck.world import World

__all__ = ["merged_world_case", "compare_runs", "world_size_relation", "bucket_size_independence"]


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


def compare_runs(a: list[dict], b: list[dict], case: Case, what: str) -> Divergence | None:
    tol = tolerance_for(case.dtype)
    names = param_names(case)
    for k, (sa, sb) in enumerate(zip(a[0]["steps"], b[0]["steps"])):
        for kind, rtol in (("grads", tol.grads), ("params", tol.params)):
            for i, (x, y) in enumerate(zip(sa[kind], sb[kind])):
                ok, diff, allowed, ratio = _close(x, y, rtol)
                if not ok:
                    return Divergence(
                        k, kind[:-1], 0, i, names[i], diff, allowed, f"{what}: the two runs differ"
                    )
    return None


def world_size_relation(
    world: World, target: Target, case: Case, *, timeout=None
) -> Divergence | None:
    payload = {**target.driver_payload(), "case": case}
    wide = world.run(target.rank_fn, payload, world_size=case.world_size, timeout=timeout)
    one = merged_world_case(case)
    narrow = world.run(target.rank_fn, {**payload, "case": one}, world_size=1, timeout=timeout)
    return compare_runs(wide, narrow, case, f"world size {case.world_size} vs 1 fed the same data")


def bucket_size_independence(
    world: World, target: Target, case: Case, other_bucket_mb: float, *, timeout=None
) -> Divergence | None:
    payload = {**target.driver_payload(), "case": case, "takes_bucket": True}
    a = world.run(target.rank_fn, payload, world_size=case.world_size, timeout=timeout)
    other = replace(case, bucket_size_mb=other_bucket_mb)
    b = world.run(
        target.rank_fn, {**payload, "case": other}, world_size=case.world_size, timeout=timeout
    )
    return compare_runs(
        a, b, case, f"bucket_size_mb {case.bucket_size_mb:g} vs {other_bucket_mb:g}"
    )
