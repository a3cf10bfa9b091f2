"""Deliberately broken RMSNorm kernels the property checks must kill.

Each mutant differs from ``paracheck.kernels.rmsnorm`` by one realistic bug in one kernel, and
runs through the same ``RMSNormFunction`` (so the same launchers, plans and autograd), with the
broken kernel swapped into an ``RMSNormKernels`` set. ``RMSNORM_MUTANTS[name](x, weight, eps)``
returns ``y`` with autograd, like ``paracheck.kernels.rms_norm``; ``RMSNORM_MUTANT_DESCRIPTIONS``
says what is broken and which inputs expose it.
"""

from __future__ import annotations

import torch

from paracheck.kernels.rmsnorm import (
    _KERNELS,
    RMSNormFunction,
    RMSNormKernels,
    gdc_launch_dependents,
    gdc_wait,
    lazy_jit,
    tl,
)

__all__ = ["RMSNORM_MUTANTS", "RMSNORM_MUTANT_DESCRIPTIONS"]


@lazy_jit
def _fwd_eps_outside_sqrt(
    X, W, Y, RSTD, stride_x, stride_y, n_rows, n_cols, eps,
    BLOCK_D: tl.constexpr, ROWS: tl.constexpr, X_EVICT: tl.constexpr, Y_EVICT: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:  # Note [dependent launch]
        gdc_wait()
        gdc_launch_dependents()
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_D)
    row_ok = rows < n_rows
    col_ok = cols < n_cols
    ok = row_ok[:, None] & col_ok[None, :]
    rows64 = rows.to(tl.int64)
    # Cache hints (Note [cache hints]): keep x for the backward, let y go first.
    x = tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=ok, other=0.0,
                eviction_policy=X_EVICT).to(tl.float32)
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    # Masked lanes hold 0, so they add nothing to the sum of squares; divide by the true width.
    rstd = 1.0 / (tl.sqrt(tl.sum(x * x, axis=1) / n_cols) + eps)  # BUG: eps outside the sqrt
    tl.store(RSTD + rows, rstd, mask=row_ok)
    y = x * rstd[:, None] * w[None, :]
    tl.store(Y + rows64[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=ok,
             eviction_policy=Y_EVICT)


@lazy_jit
def _fwd_unmasked_tail(
    X, W, Y, RSTD, stride_x, stride_y, n_rows, n_cols, eps,
    BLOCK_D: tl.constexpr, ROWS: tl.constexpr, X_EVICT: tl.constexpr, Y_EVICT: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:  # Note [dependent launch]
        gdc_wait()
        gdc_launch_dependents()
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_D)
    row_ok = rows < n_rows
    col_ok = cols < n_cols
    ok = row_ok[:, None] & col_ok[None, :]
    rows64 = rows.to(tl.int64)
    # Cache hints (Note [cache hints]): keep x for the backward, let y go first.
    # BUG: the load masks rows only, so the padded tail of the block (cols >= n_cols) reads
    # whatever follows the row (the next row, padding, or a guard buffer) into the sum.
    x_mask = row_ok[:, None] & (cols[None, :] < BLOCK_D)
    x = tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=x_mask, other=0.0,
                eviction_policy=X_EVICT).to(tl.float32)
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    # Masked lanes hold 0, so they add nothing to the sum of squares; divide by the true width.
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / n_cols + eps)
    tl.store(RSTD + rows, rstd, mask=row_ok)
    y = x * rstd[:, None] * w[None, :]
    tl.store(Y + rows64[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=ok,
             eviction_policy=Y_EVICT)


@lazy_jit
def _bwd_dx_without_mean_term(
    X, W, DY, RSTD, DX, DW_PARTIAL, stride_x, stride_dy, stride_dx, n_rows, n_cols,
    BLOCK_D: tl.constexpr, ROWS: tl.constexpr, LOAD_EVICT: tl.constexpr, PDL: tl.constexpr,
    REVERSE: tl.constexpr,
):
    # dx = rstd * (w*dy - xhat * mean(xhat * w*dy)),  dweight = sum over rows of dy * xhat,
    # with xhat = x * rstd recomputed from the saved per-row rstd (no second reduction of x^2).
    # The loop is software-pipelined by hand: the next tile's loads are issued before this
    # tile's arithmetic, so each program keeps two tiles of x and dy in flight.
    if PDL:  # Note [dependent launch]
        gdc_wait()
        gdc_launch_dependents()
    pid = tl.program_id(0)
    step = tl.num_programs(0) * ROWS
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < n_cols
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
    rows = pid * ROWS + tl.arange(0, ROWS)
    row_ok = rows < n_rows
    ok = row_ok[:, None] & col_ok[None, :]
    if REVERSE:  # Note [reverse walk]
        rows = n_rows - 1 - rows
    rows64 = rows.to(tl.int64)
    x = tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=ok, other=0.0,
                eviction_policy=LOAD_EVICT)
    dy = tl.load(DY + rows64[:, None] * stride_dy + cols[None, :], mask=ok, other=0.0,
                 eviction_policy=LOAD_EVICT)
    rstd = tl.load(RSTD + rows, mask=row_ok, other=0.0)
    for start in range(pid * ROWS, n_rows, step):
        nrows = start + step + tl.arange(0, ROWS)
        nrow_ok = nrows < n_rows
        nok = nrow_ok[:, None] & col_ok[None, :]
        if REVERSE:
            nrows = n_rows - 1 - nrows
        nrows64 = nrows.to(tl.int64)
        x_next = tl.load(X + nrows64[:, None] * stride_x + cols[None, :], mask=nok, other=0.0,
                         eviction_policy=LOAD_EVICT)
        dy_next = tl.load(DY + nrows64[:, None] * stride_dy + cols[None, :], mask=nok, other=0.0,
                          eviction_policy=LOAD_EVICT)
        rstd_next = tl.load(RSTD + nrows, mask=nrow_ok, other=0.0)
        rows = start + tl.arange(0, ROWS)
        ok = (rows < n_rows)[:, None] & col_ok[None, :]
        if REVERSE:
            rows = n_rows - 1 - rows
        rows64 = rows.to(tl.int64)
        xf = x.to(tl.float32)
        dyf = dy.to(tl.float32)
        xhat = xf * rstd[:, None]
        wdy = dyf * w[None, :]
        c = tl.sum(xhat * wdy, axis=1) / n_cols
        dx = wdy * rstd[:, None]  # BUG: treats rstd as a constant (drops -xhat * c)
        tl.store(DX + rows64[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty),
                 mask=ok)
        dw_acc += dyf * xhat
        x = x_next
        dy = dy_next
        rstd = rstd_next
    tl.store(DW_PARTIAL + pid * n_cols + cols, tl.sum(dw_acc, axis=0), mask=col_ok)


@lazy_jit
def _bwd_partials_overwrite(
    X, W, DY, RSTD, DX, DW_PARTIAL, stride_x, stride_dy, stride_dx, n_rows, n_cols,
    BLOCK_D: tl.constexpr, ROWS: tl.constexpr, LOAD_EVICT: tl.constexpr, PDL: tl.constexpr,
    REVERSE: tl.constexpr,
):
    # dx = rstd * (w*dy - xhat * mean(xhat * w*dy)),  dweight = sum over rows of dy * xhat,
    # with xhat = x * rstd recomputed from the saved per-row rstd (no second reduction of x^2).
    # The loop is software-pipelined by hand: the next tile's loads are issued before this
    # tile's arithmetic, so each program keeps two tiles of x and dy in flight.
    if PDL:  # Note [dependent launch]
        gdc_wait()
        gdc_launch_dependents()
    pid = tl.program_id(0)
    step = tl.num_programs(0) * ROWS
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < n_cols
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
    rows = pid * ROWS + tl.arange(0, ROWS)
    row_ok = rows < n_rows
    ok = row_ok[:, None] & col_ok[None, :]
    if REVERSE:  # Note [reverse walk]
        rows = n_rows - 1 - rows
    rows64 = rows.to(tl.int64)
    x = tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=ok, other=0.0,
                eviction_policy=LOAD_EVICT)
    dy = tl.load(DY + rows64[:, None] * stride_dy + cols[None, :], mask=ok, other=0.0,
                 eviction_policy=LOAD_EVICT)
    rstd = tl.load(RSTD + rows, mask=row_ok, other=0.0)
    for start in range(pid * ROWS, n_rows, step):
        nrows = start + step + tl.arange(0, ROWS)
        nrow_ok = nrows < n_rows
        nok = nrow_ok[:, None] & col_ok[None, :]
        if REVERSE:
            nrows = n_rows - 1 - nrows
        nrows64 = nrows.to(tl.int64)
        x_next = tl.load(X + nrows64[:, None] * stride_x + cols[None, :], mask=nok, other=0.0,
                         eviction_policy=LOAD_EVICT)
        dy_next = tl.load(DY + nrows64[:, None] * stride_dy + cols[None, :], mask=nok, other=0.0,
                          eviction_policy=LOAD_EVICT)
        rstd_next = tl.load(RSTD + nrows, mask=nrow_ok, other=0.0)
        rows = start + tl.arange(0, ROWS)
        ok = (rows < n_rows)[:, None] & col_ok[None, :]
        if REVERSE:
            rows = n_rows - 1 - rows
        rows64 = rows.to(tl.int64)
        xf = x.to(tl.float32)
        dyf = dy.to(tl.float32)
        xhat = xf * rstd[:, None]
        wdy = dyf * w[None, :]
        c = tl.sum(xhat * wdy, axis=1) / n_cols
        dx = (wdy - xhat * c[:, None]) * rstd[:, None]
        tl.store(DX + rows64[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty),
                 mask=ok)
        dw_acc += dyf * xhat
        x = x_next
        dy = dy_next
        rstd = rstd_next
    # BUG: the partial row index (pid * n_cols) is missing: every program writes row 0.
    tl.store(DW_PARTIAL + cols, tl.sum(dw_acc, axis=0), mask=col_ok)


@lazy_jit
def _bwd_reverse_walk_rstd_forward_order(
    X, W, DY, RSTD, DX, DW_PARTIAL, stride_x, stride_dy, stride_dx, n_rows, n_cols,
    BLOCK_D: tl.constexpr, ROWS: tl.constexpr, LOAD_EVICT: tl.constexpr, PDL: tl.constexpr,
    REVERSE: tl.constexpr,
):
    # dx = rstd * (w*dy - xhat * mean(xhat * w*dy)),  dweight = sum over rows of dy * xhat,
    # with xhat = x * rstd recomputed from the saved per-row rstd (no second reduction of x^2).
    # The loop is software-pipelined by hand: the next tile's loads are issued before this
    # tile's arithmetic, so each program keeps two tiles of x and dy in flight.
    if PDL:  # Note [dependent launch]
        gdc_wait()
        gdc_launch_dependents()
    pid = tl.program_id(0)
    step = tl.num_programs(0) * ROWS
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < n_cols
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
    rows = pid * ROWS + tl.arange(0, ROWS)
    row_ok = rows < n_rows
    ok = row_ok[:, None] & col_ok[None, :]
    if REVERSE:  # Note [reverse walk]
        rows = n_rows - 1 - rows
    rows64 = rows.to(tl.int64)
    x = tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=ok, other=0.0,
                eviction_policy=LOAD_EVICT)
    dy = tl.load(DY + rows64[:, None] * stride_dy + cols[None, :], mask=ok, other=0.0,
                 eviction_policy=LOAD_EVICT)
    # BUG: the per-row rstd is read in the forward order, not at the reversed row
    rstd = tl.load(RSTD + pid * ROWS + tl.arange(0, ROWS), mask=row_ok, other=0.0)
    for start in range(pid * ROWS, n_rows, step):
        nrows = start + step + tl.arange(0, ROWS)
        nrow_ok = nrows < n_rows
        nok = nrow_ok[:, None] & col_ok[None, :]
        if REVERSE:
            nrows = n_rows - 1 - nrows
        nrows64 = nrows.to(tl.int64)
        x_next = tl.load(X + nrows64[:, None] * stride_x + cols[None, :], mask=nok, other=0.0,
                         eviction_policy=LOAD_EVICT)
        dy_next = tl.load(DY + nrows64[:, None] * stride_dy + cols[None, :], mask=nok, other=0.0,
                          eviction_policy=LOAD_EVICT)
        rstd_next = tl.load(RSTD + start + step + tl.arange(0, ROWS), mask=nrow_ok, other=0.0)
        rows = start + tl.arange(0, ROWS)
        ok = (rows < n_rows)[:, None] & col_ok[None, :]
        if REVERSE:
            rows = n_rows - 1 - rows
        rows64 = rows.to(tl.int64)
        xf = x.to(tl.float32)
        dyf = dy.to(tl.float32)
        xhat = xf * rstd[:, None]
        wdy = dyf * w[None, :]
        c = tl.sum(xhat * wdy, axis=1) / n_cols
        dx = (wdy - xhat * c[:, None]) * rstd[:, None]
        tl.store(DX + rows64[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty),
                 mask=ok)
        dw_acc += dyf * xhat
        x = x_next
        dy = dy_next
        rstd = rstd_next
    tl.store(DW_PARTIAL + pid * n_cols + cols, tl.sum(dw_acc, axis=0), mask=col_ok)


def _with(**swap) -> RMSNormKernels:
    kernels = {"forward": _KERNELS.forward, "backward": _KERNELS.backward,
               "reduce_dweight": _KERNELS.reduce_dweight}
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
