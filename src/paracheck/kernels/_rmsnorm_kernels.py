"""Layer 1 of the Triton RMSNorm (``paracheck.kernels.rmsnorm``): the ``@triton.jit`` kernels,
jitted lazily.

Note [interpreter mode]: triton decides between compiling and interpreting a kernel when
``triton.jit`` runs, reading ``TRITON_INTERPRET`` at that moment. The kernels here are therefore
plain functions wrapped in ``LazyJit``, which calls ``triton.jit`` at the first launch (and again
if the mode changed), so importing this module fixes nothing and ``import paracheck.kernels``
works without triton installed; a missing triton is reported at the first launch.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is absent
    triton = None
    gdc_wait = gdc_launch_dependents = None

    class tl:  # noqa: N801 - stands in for triton.language so kernel annotations evaluate
        constexpr = None
else:
    try:  # Note [dependent launch]; triton >= 3.3
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    except ImportError:  # pragma: no cover - older triton: plain launches
        gdc_wait = gdc_launch_dependents = None


def triton_available() -> bool:
    """Whether triton can be imported (kernels can run at all)."""
    return triton is not None


def interpreting() -> bool:
    # Same source of truth as triton.jit itself (Note [interpreter mode]).
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def require_triton() -> None:
    if triton is None:
        raise RuntimeError(
            "paracheck.kernels needs triton: pip install 'paracheck[triton]' (or triton>=3.0)"
        )


class LazyJit:
    """A kernel function that is ``triton.jit``-decorated at its first launch."""

    def __init__(self, fn):
        self.fn = fn
        self._by_mode: dict[bool, object] = {}
        functools.update_wrapper(self, fn)

    def __getitem__(self, grid):
        return self.jitted()[grid]

    def jitted(self):
        """The ``triton.jit`` function for the current mode (Note [interpreter mode])."""
        require_triton()
        mode = interpreting()
        jitted = self._by_mode.get(mode)
        if jitted is None:
            jitted = self._by_mode[mode] = triton.jit(self.fn)
        return jitted


def lazy_jit(fn) -> LazyJit:
    """Decorator: ``triton.jit`` deferred to the first launch (Note [interpreter mode])."""
    return LazyJit(fn)


# --------------------------------------------------------------------------------------------
# Layer 1: kernels. All arithmetic in float32 whatever the storage dtype.


@lazy_jit
def _rms_norm_fwd_kernel(
    X,
    W,
    Y,
    RSTD,
    stride_x,
    stride_y,
    n_rows,
    n_cols,
    eps,
    BLOCK_D: tl.constexpr,
    ROWS: tl.constexpr,
    X_EVICT: tl.constexpr,
    Y_EVICT: tl.constexpr,
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
    x = tl.load(
        X + rows64[:, None] * stride_x + cols[None, :], mask=ok, other=0.0, eviction_policy=X_EVICT
    ).to(tl.float32)
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    # Masked lanes hold 0, so they add nothing to the sum of squares; divide by the true width.
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / n_cols + eps)
    tl.store(RSTD + rows, rstd, mask=row_ok)
    y = x * rstd[:, None] * w[None, :]
    tl.store(
        Y + rows64[:, None] * stride_y + cols[None, :],
        y.to(Y.dtype.element_ty),
        mask=ok,
        eviction_policy=Y_EVICT,
    )


@lazy_jit
def _rms_norm_bwd_kernel(
    X,
    W,
    DY,
    RSTD,
    DX,
    DW_PARTIAL,
    stride_x,
    stride_dy,
    stride_dx,
    n_rows,
    n_cols,
    BLOCK_D: tl.constexpr,
    ROWS: tl.constexpr,
    LOAD_EVICT: tl.constexpr,
    PDL: tl.constexpr,
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
    x = tl.load(
        X + rows64[:, None] * stride_x + cols[None, :],
        mask=ok,
        other=0.0,
        eviction_policy=LOAD_EVICT,
    )
    dy = tl.load(
        DY + rows64[:, None] * stride_dy + cols[None, :],
        mask=ok,
        other=0.0,
        eviction_policy=LOAD_EVICT,
    )
    rstd = tl.load(RSTD + rows, mask=row_ok, other=0.0)
    for start in range(pid * ROWS, n_rows, step):
        nrows = start + step + tl.arange(0, ROWS)
        nrow_ok = nrows < n_rows
        nok = nrow_ok[:, None] & col_ok[None, :]
        if REVERSE:
            nrows = n_rows - 1 - nrows
        nrows64 = nrows.to(tl.int64)
        x_next = tl.load(
            X + nrows64[:, None] * stride_x + cols[None, :],
            mask=nok,
            other=0.0,
            eviction_policy=LOAD_EVICT,
        )
        dy_next = tl.load(
            DY + nrows64[:, None] * stride_dy + cols[None, :],
            mask=nok,
            other=0.0,
            eviction_policy=LOAD_EVICT,
        )
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
        tl.store(
            DX + rows64[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=ok
        )
        dw_acc += dyf * xhat
        x = x_next
        dy = dy_next
        rstd = rstd_next
    tl.store(DW_PARTIAL + pid * n_cols + cols, tl.sum(dw_acc, axis=0), mask=col_ok)


@lazy_jit
def _rms_norm_dw_kernel(
    PARTIAL,
    DW,
    n_partials,
    n_cols,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:  # Note [dependent launch]
        gdc_wait()
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < n_cols
    acc = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)
    for p0 in range(0, n_partials, BLOCK_P):
        ps = p0 + tl.arange(0, BLOCK_P)
        ok = (ps < n_partials)[:, None] & col_ok[None, :]
        acc += tl.load(PARTIAL + ps[:, None] * n_cols + cols[None, :], mask=ok, other=0.0)
    tl.store(DW + cols, tl.sum(acc, axis=0).to(DW.dtype.element_ty), mask=col_ok)


@dataclass(frozen=True)
class RMSNormKernels:
    """The three kernels a launch uses; mutants swap one of them for a broken variant."""

    forward: LazyJit
    backward: LazyJit
    reduce_dweight: LazyJit


KERNELS = RMSNormKernels(_rms_norm_fwd_kernel, _rms_norm_bwd_kernel, _rms_norm_dw_kernel)
