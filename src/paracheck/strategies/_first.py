"""Cases built for one bug each, that a check of a kind runs first, as they are
(``Kind.first_cases``): where its strategy draws them too rarely to find the bug within a default
check's examples."""

from __future__ import annotations

from paracheck.cases import Case, GroupSpec, OptimizerSpec
from paracheck.strategies._core import NOMINAL_DTYPES
from paracheck.workloads import MLPSpec

__all__ = ["compiled_no_sync_cases"]


# Note [A compiled case under no_sync()]
#   A compiled DDP case is drawn to find what compiling changes in the wrapper's protocol: hooks
#   that Dynamo folds away, and no_sync() honoured only eagerly. The second needs a compiled case
#   at two ranks or more that accumulates under no_sync(), and the strategy draws few: in the 40
#   derandomised cases of a default check at world sizes 1-4, three were compiled, none of them
#   under no_sync(), and a wrapper whose compiled forward turned synchronisation back on passed
#   (its ledger is the only difference: the same average). Drawing more compiled cases costs a
#   second of compiling each. So, as a sharded check runs a case built for a partition by count
#   first (Note [A partition by count] in paracheck.strategies._sharding), a DDP check runs one
#   compiled case first, as it is: two micro-steps under no_sync() at the smallest world size of
#   two or more it draws, aot_eager, in float64 or float32 (no case is compiled below float32:
#   Note [Compiled cases] in paracheck.cases._compile). It runs in the verdict table's first row
#   that draws both (the all-features row), never in a check that turns either off (the main
#   job), and in a search of the whole contract where asked (``CheckSettings.first_cases``: the
#   selftest, which stands in for the table). Not by default there: with its eager twin for the
#   compile ledger it cost a DDP check 4-5 s of the loaded test machine, and paracheck's own
#   first tier 60 s in 126.
_NO_SYNC_MODEL = MLPSpec(in_features=2, widths=(2, 1), bias=False)


def compiled_no_sync_cases(*, world_sizes, precision: str = "fp64") -> tuple[tuple[str, Case], ...]:
    """The case a ``ddp`` check runs first (Note [A compiled case under no_sync()]), with why it
    is run; none where no world size of two or more is drawn or ``precision`` compiles nothing."""
    w = min((s for s in world_sizes if s >= 2), default=None)
    if w is None or precision not in ("fp64", "fp32"):
        return ()
    case = Case(
        model=_NO_SYNC_MODEL,
        world_size=w,
        batch_sizes=(1,) * w,
        steps=1,
        accumulation=2,
        no_sync=True,
        optimizer=OptimizerSpec(name="sgd", groups=(GroupSpec(params=(), lr=1e-2),)),
        seed=0,
        dtype=NOMINAL_DTYPES[precision],
        compiled="aot_eager",
    )
    why = "a compiled case accumulating under no_sync(), built to show a sync compiling turns on"
    return ((why, case),)
