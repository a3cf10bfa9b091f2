"""Deliberately broken RMSNorm kernels the property checks must kill.

Each mutant differs from ``paracheck.kernels.rmsnorm`` by one realistic bug in one kernel (its
source is the production kernel's with the bug's lines replaced, see ``_mutated``), and runs
through the same ``RMSNormFunction`` (so the same launchers, plans and autograd), with the
broken kernel swapped into an ``RMSNormKernels`` set. ``RMSNORM_MUTANTS[name](x, weight, eps)``
returns ``y`` with autograd, like ``paracheck.kernels.rms_norm``; ``RMSNORM_MUTANT_DESCRIPTIONS``
says what is broken and which inputs expose it.
"""

from __future__ import annotations

import torch

from paracheck.kernels.rmsnorm import (
    KERNELS,
    LazyJit,
    RMSNormFunction,
    RMSNormKernels,
    lazy_jit,
)
from paracheck.mutants._edit import edited

__all__ = ["RMSNORM_MUTANTS", "RMSNORM_MUTANT_DESCRIPTIONS"]


def _mutated(kernel: LazyJit, name: str, *edits: tuple[str, str]) -> LazyJit:
    """``kernel`` with each ``(line, replacement)`` of ``edits`` applied to its source (see
    ``edited``), under a name of its own, jitted lazily like the production kernels."""
    return lazy_jit(edited(kernel.fn, *edits, name=name))


_fwd_eps_outside_sqrt = _mutated(
    KERNELS.forward,
    "_fwd_eps_outside_sqrt",
    (
        "    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / n_cols + eps)\n",
        "    rstd = 1.0 / (tl.sqrt(tl.sum(x * x, axis=1) / n_cols) + eps)  # BUG: eps outside the sqrt\n",
    ),
)
_fwd_unmasked_tail = _mutated(
    KERNELS.forward,
    "_fwd_unmasked_tail",
    (
        "        X + rows64[:, None] * stride_x + cols[None, :], mask=ok, other=0.0, eviction_policy",
        # BUG: rows masked only: the padded tail of the block (cols >= n_cols) reads whatever
        # follows the row (the next row, padding, or a guard buffer) into the sum.
        "        X + rows64[:, None] * stride_x + cols[None, :], mask=row_ok[:, None], other=0.0, "
        "eviction_policy",
    ),
)
_bwd_dx_without_mean_term = _mutated(
    KERNELS.backward,
    "_bwd_dx_without_mean_term",
    (
        "        dx = (wdy - xhat * c[:, None]) * rstd[:, None]\n",
        "        dx = wdy * rstd[:, None]  # BUG: treats rstd as a constant (drops -xhat * c)\n",
    ),
)
_bwd_partials_overwrite = _mutated(
    KERNELS.backward,
    "_bwd_partials_overwrite",
    (
        "    tl.store(DW_PARTIAL + pid * n_cols + cols, tl.sum(dw_acc, axis=0), mask=col_ok)\n",
        "    tl.store(DW_PARTIAL + cols, tl.sum(dw_acc, axis=0), mask=col_ok)  # BUG: no pid * n_cols\n",
    ),
)
_bwd_reverse_walk_rstd_forward_order = _mutated(
    KERNELS.backward,
    "_bwd_reverse_walk_rstd_forward_order",
    # BUG: the saved rstd is read at the forward-order row, not at the reversed one.
    (
        "    rstd = tl.load(RSTD + rows, mask=row_ok, other=0.0)\n",
        "    rstd = tl.load(RSTD + pid * ROWS + tl.arange(0, ROWS), mask=row_ok, other=0.0)\n",
    ),
    (
        "        rstd_next = tl.load(RSTD + nrows, mask=nrow_ok, other=0.0)\n",
        "        rstd_next = tl.load(RSTD + start + step + tl.arange(0, ROWS), mask=nrow_ok, other=0.0)\n",
    ),
)


def _with(**swap) -> RMSNormKernels:
    kernels = {
        "forward": KERNELS.forward,
        "backward": KERNELS.backward,
        "reduce_dweight": KERNELS.reduce_dweight,
    }
    kernels.update(swap)
    return RMSNormKernels(**kernels)


def _mutant(kernels: RMSNormKernels, name: str, description: str):
    def rms_norm_mutant(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return RMSNormFunction.apply(x, weight, eps, kernels)

    rms_norm_mutant.__name__ = rms_norm_mutant.__qualname__ = f"rms_norm_{name}"
    rms_norm_mutant.__doc__ = description
    return rms_norm_mutant


RMSNORM_MUTANT_DESCRIPTIONS: dict[str, str] = {
    "eps_outside_sqrt": (
        "forward computes x / (sqrt(mean(x^2)) + eps): invisible for mean(x^2) >> eps, "
        "exposed by small-magnitude rows"
    ),
    "unmasked_tail_load": (
        "forward loads the padded tail of the block without a column mask: exposed by any "
        "width that is not a power of two (reads the next row, padding or NaN guards)"
    ),
    "dx_without_mean_term": (
        "backward treats rstd as a constant, dx = rstd * w * dy: wrong dx whenever "
        "sum(xhat * w * dy) != 0"
    ),
    "dweight_partials_overwrite": (
        "every backward program stores its dweight partial in row 0 of the partial buffer "
        "(missing pid offset): programs overwrite each other and the other rows stay unwritten; "
        "exposed once the backward runs on two or more programs"
    ),
    "reverse_walk_rstd_forward_order": (
        "the backward walks rows last to first (Note [reverse walk]) but reads each row's saved "
        "rstd in the forward order: exposed by two or more rows of different mean squares"
    ),
}

_MUTANT_KERNELS = {
    "eps_outside_sqrt": _with(forward=_fwd_eps_outside_sqrt),
    "unmasked_tail_load": _with(forward=_fwd_unmasked_tail),
    "dx_without_mean_term": _with(backward=_bwd_dx_without_mean_term),
    "dweight_partials_overwrite": _with(backward=_bwd_partials_overwrite),
    "reverse_walk_rstd_forward_order": _with(backward=_bwd_reverse_walk_rstd_forward_order),
}

RMSNORM_MUTANTS = {
    name: _mutant(kernels, name, RMSNORM_MUTANT_DESCRIPTIONS[name])
    for name, kernels in _MUTANT_KERNELS.items()
}
