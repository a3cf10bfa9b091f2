"""The ``reduce-dtype`` property (DDP targets that declare the dtype they reduce gradients in):
every synchronisation window communicates the gradients in the declared dtype. Exact: read from
the collectives each rank issued (``Window.typed``), not from rounding.

Note [Declared reduction dtype]
    A design may reduce its gradients in a dtype of its choosing: float32 for bfloat16 gradients
    (sums of bfloat16 values lose a bit per addition; upcasting first keeps the sum to float32
    rounding), float32 for float32 ones. It declares the choice on its class,
    ``paracheck_reduce_dtype = "float32"`` (or ``torch.float32``), or ``paracheck check
    --reduce-dtype float32`` declares it for it. Then, for every window on every rank at world
    size >= 2, with G the trainable parameters' elements and n their number:

    the all-reduce and reduce-scatter calls in floating-point dtypes other than the declared one
    carry at most 8 bytes per trainable parameter (presence flags or counts,
    ``METADATA_BYTES_PER_PARAM`` as in the bucket structure): every gradient goes in the
    declared dtype, so the cast comes *before* communicating. (How many gradient elements a
    window sends is not required here: a correct design may leave out a parameter no rank used.)

    A design that casts after communicating (reduces the bfloat16 gradients, then upcasts the
    sums) or that reduces in bfloat16 where it declared float32 sends its gradients in another
    dtype and breaks the rule whatever its rounding. The gradients themselves are still
    compared with the oracle's (``equivalence``): the declared dtype changes how the mean is
    rounded, never what it is. A dtype narrower than the parameters' (bfloat16 compression of
    float32 gradients) rounds the mean itself; such cases are not judged (``narrower_than``):
    check compressed designs at the parameters' dtype with ``--precision bf16``.

    A fully sharded wrapper declares the dtype it reduces the gradients of its compute dtype in
    (Note [Compute dtype of an FSDP] in ``paracheck.cases``): the rule is judged in the cases
    that give it a compute dtype, and says nothing of the others, where the gradients are
    reduced in the parameters' own dtype.
"""

from __future__ import annotations

import torch

from paracheck.cases import Case
from paracheck.check.properties._case import case_params
from paracheck.check.properties._divergence import Divergence
from paracheck.check.properties.bucket_structure import METADATA_BYTES_PER_PARAM
from paracheck.check.ranks.record import RankRecord

__all__ = [
    "FLOATING",
    "NAME",
    "REDUCE_DTYPES",
    "check_reduce_dtype",
    "narrower_than",
    "window_breaks",
]

NAME = "reduce-dtype"
REDUCE_DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}
_REDUCING = ("all_reduce", "reduce_scatter")
FLOATING = frozenset({"float64", "float32", "bfloat16", "float16"})  # the payloads judged


def narrower_than(declared: str, case: Case) -> str | None:
    """The widest parameter dtype of ``case`` where ``declared`` is narrower (fewer bytes) than
    it, else None: a compressed reduction, which the case does not judge."""
    size = REDUCE_DTYPES[declared].itemsize
    wider = [p.dtype for p in case_params(case) if p.dtype.itemsize > size]
    return str(max(wider, key=lambda d: d.itemsize)).removeprefix("torch.") if wider else None


def window_breaks(typed, declared: str, n_params: int) -> str | None:
    """Why a window's typed calls (name, dtype, bytes) break Note [Declared reduction dtype], or
    None."""
    others: dict[str, int] = {}
    for name, d, b in typed:
        if name in _REDUCING and d != declared and d in FLOATING:
            others[d] = others.get(d, 0) + b
    allowance = METADATA_BYTES_PER_PARAM * n_params
    extra = sum(others.values())
    if extra <= allowance:
        return None
    size = REDUCE_DTYPES[declared].itemsize
    mine = sum(b for name, d, b in typed if name in _REDUCING and d == declared)
    return (
        f"{extra} bytes reduced in {', '.join(sorted(others))} and {mine // size} elements in "
        f"the declared {declared}, where at most {allowance} bytes of presence flags may go in "
        f"another dtype: cast the gradients to {declared} before communicating"
    )


def check_reduce_dtype(
    case: Case, ranks: list[RankRecord], declared: str | None, *, fsdp: bool = False
):
    """The first window on any rank that breaks Note [Declared reduction dtype], as a Divergence,
    or None (nothing declared, world size 1, a dtype narrower than the parameters', or with
    ``fsdp`` a case without a compute dtype)."""
    if declared is None or case.world_size < 2 or narrower_than(declared, case) is not None:
        return None
    if fsdp and not case.masters_from_float32:
        return None
    trainable = [p for p in case_params(case) if p.requires_grad]
    for r, rec in enumerate(ranks):
        for k, step in enumerate(rec.steps):
            for window in step.windows:
                why = window_breaks(window.typed, declared, len(trainable))
                if why is not None:
                    return Divergence(k, NAME, r, None, None, 0.0, 0.0, why)
    return None
