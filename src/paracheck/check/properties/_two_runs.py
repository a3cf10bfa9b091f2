"""Comparing two runs of the same target (the oracle-free properties)."""

from __future__ import annotations

from paracheck.cases import Case
from paracheck.check.properties._case import case_params, param_names
from paracheck.check.properties._divergence import Divergence
from paracheck.check.properties.closeness import close
from paracheck.check.ranks.record import RankRecord
from paracheck.oracle.tolerance import tolerance_for

__all__ = ["compare_runs", "one_dtype"]


def one_dtype(case: Case) -> bool:
    """Whether every parameter of ``case``'s model has the case's dtype: the relations compare
    whole trajectories at the case's tolerance, and a float32 layer computes differently once
    the runs group their sums differently. A forward under autocast computes in a second dtype
    (bfloat16 or float16 rounding of float32 differences, Note [Anchored steps]): not one dtype."""
    if getattr(case, "autocast", None) is not None:
        return False
    return {str(p.dtype).removeprefix("torch.") for p in case_params(case)} == {case.dtype}


def compare_runs(
    a: list[RankRecord], b: list[RankRecord], case: Case, prop: str, what: str
) -> Divergence | None:
    """Rank 0's synchronised gradients and parameters after every step of two runs, under the
    tolerance policy (``paracheck.oracle.tolerance``): the runs differ only in summation order.
    The divergence names ``prop``, the property the two runs must satisfy."""
    tol = tolerance_for(case.dtype)
    names = param_names(case)
    for k, (sa, sb) in enumerate(zip(a[0].steps, b[0].steps)):
        for kind, rtol in (("grads", tol.grads), ("params", tol.params)):
            for i, (x, y) in enumerate(zip(getattr(sa, kind), getattr(sb, kind))):
                ok, diff, allowed, ratio = close(x, y, rtol)
                if not ok:
                    return Divergence(
                        k,
                        prop,
                        0,
                        i,
                        names[i],
                        diff,
                        allowed,
                        f"{what}: the two runs' {kind[:-1]}s differ",
                    )
    return None
