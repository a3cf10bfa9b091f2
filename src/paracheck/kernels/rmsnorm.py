"""Triton RMSNorm, forward and backward, in four layers.

kernels (``@triton.jit``) -> launchers (plan, checks, allocation) -> ``RMSNormFunction``
(``torch.autograd.Function``) -> ``TritonRMSNorm`` (``nn.Module``). The specification is
``paracheck.oracle.rmsnorm.rms_norm_reference``; ``RMSNORM_TOLERANCES``
(``paracheck.oracle.tolerance``) says how close these kernels are to it.

Note [interpreter mode]: triton decides between compiling and interpreting a kernel when
``triton.jit`` runs, reading ``TRITON_INTERPRET`` at that moment. The kernels here are therefore
plain functions wrapped in ``_LazyJit``, which calls ``triton.jit`` at the first launch (and again
if the mode changed), so importing this module fixes nothing and ``import paracheck.kernels``
works without triton installed; a missing triton is reported at the first launch.

Note [tiles and programs]: the forward runs one program per tile of ``ROWS`` rows, the whole
(power-of-two padded) row in registers. The backward is persistent: a few programs per SM each
walk tiles ``pid, pid + P, ...``, keep the dweight contribution of their rows in a register
tile, and write one float32 partial row each; a second small kernel sums the ``P`` partials
(deterministic: no atomics). Summing the partials inside the backward instead -- its last
programs to finish waiting for each other, then reducing a column chunk each -- was measured
slower on an H200 at every shape than this second launch (4096x1024: the backward grew from
10.5 to 17.9 us, against 2.6 us for the extra kernel and ~1 us of gap), so it is not used
(``experiments/rmsnorm_experiments.py`` times the alternatives). The backward loop loads the next
tile before it works on the current one (software pipelining by hand: two tiles in flight per
program). Block sizes, warps and programs per SM come from sweeps on an H200
(``scripts/bench_rmsnorm.py --sweep``, ``experiments/rmsnorm_experiments.py --what ab``). In the
interpreter each program instance costs about 1.6 ms whatever its size, so the plan uses few
programs with many rows there.

Launches: Note [dependent launch] (the gaps between the three kernels on sm_90+);
``docs/rmsnorm-h200.md`` has the measurements.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from paracheck.oracle.tolerance import (
    RMSNORM_INTERPRETER_TOLERANCES,
    RMSNORM_TOLERANCES,
    RMSNormTolerance,
    rms_norm_tolerance,
    rounding_depth,
)

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


__all__ = [
    "MAX_WIDTH",
    "RMSNORM_INTERPRETER_TOLERANCES",
    "RMSNORM_TOLERANCES",
    "RMSNormFunction",
    "RMSNormKernels",
    "RMSNormTolerance",
    "TritonRMSNorm",
    "lazy_jit",
    "rms_norm",
    "rms_norm_tolerance",
    "rounding_depth",
    "triton_available",
]

MAX_WIDTH = 65536
_SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def triton_available() -> bool:
    """Whether triton can be imported (kernels can run at all)."""
    return triton is not None


def _interpreting() -> bool:
    # Same source of truth as triton.jit itself (Note [interpreter mode]).
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def _require_triton() -> None:
    if triton is None:
        raise RuntimeError(
            "paracheck.kernels needs triton: pip install 'paracheck[triton]' (or triton>=3.0)"
        )


class _LazyJit:
    """A kernel function that is ``triton.jit``-decorated at its first launch."""

    def __init__(self, fn):
        self.fn = fn
        self._by_mode: dict[bool, object] = {}
        functools.update_wrapper(self, fn)

    def __getitem__(self, grid):
        return self.jitted()[grid]

    def jitted(self):
        """The ``triton.jit`` function for the current mode (Note [interpreter mode])."""
        _require_triton()
        mode = _interpreting()
        jitted = self._by_mode.get(mode)
        if jitted is None:
            jitted = self._by_mode[mode] = triton.jit(self.fn)
        return jitted


def lazy_jit(fn) -> _LazyJit:
    """Decorator: ``triton.jit`` deferred to the first launch (Note [interpreter mode])."""
    return _LazyJit(fn)


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

    forward: _LazyJit
    backward: _LazyJit
    reduce_dweight: _LazyJit


_KERNELS = RMSNormKernels(_rms_norm_fwd_kernel, _rms_norm_bwd_kernel, _rms_norm_dw_kernel)


# --------------------------------------------------------------------------------------------
# Layer 2: launchers. A pure plan, then checks, allocation and launches.


@dataclass(frozen=True)
class _Plan:
    block_d: int
    fwd_rows: int
    fwd_warps: int
    bwd_rows: int
    bwd_warps: int
    bwd_programs: int
    red_block_p: int
    red_block_n: int
    bwd_reverse: bool = False  # Note [reverse walk]
    x_evict: str = ""  # eviction policies, Note [cache hints]
    y_evict: str = ""
    bwd_load_evict: str = ""


def _pow2_at_most(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def _clamp(v: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, v))


def _gpu_plan(
    n_rows: int,
    n_cols: int,
    *,
    n_sms: int,
    fwd_rows: int,
    fwd_warps: int,
    bwd_rows: int,
    bwd_warps: int,
    bwd_per_sm: int,
    **hints: str,
) -> _Plan:
    """A GPU plan from its free parameters; the persistent grid has as many tiles per program."""
    block_d = triton.next_power_of_2(n_cols)
    n_tiles = -(-n_rows // bwd_rows)
    waves = -(-n_tiles // (bwd_per_sm * n_sms))
    programs = -(-n_tiles // waves)
    # One pass over the partials when they fit: BLOCK_P x BLOCK_N = 4096 values per program.
    red_block_p = min(triton.next_power_of_2(programs), 1024)
    red_block_n = _clamp(4096 // red_block_p, 1, block_d)
    return _Plan(
        block_d,
        fwd_rows,
        fwd_warps,
        bwd_rows,
        bwd_warps,
        programs,
        red_block_p,
        red_block_n,
        **hints,
    )


# Note [reverse walk]: the backward may walk the rows last to first. The forward wrote y and read
# x first to last, so the rows it touched last are the likeliest to still be in the L2 when the
# backward starts; in training, the dy a preceding backward kernel wrote last is too. Which order
# is faster is measured per width (``experiments/rmsnorm_experiments.py --what reverse``); the
# results do not depend on it except through the order of the dweight partial sums.

_REVERSE_MAX_BLOCK = 4096  # Note [reverse walk]: the widest (padded) rows walked last to first

# Tensors up to this size (per tensor) are treated as L2-resident between forward and backward.
_L2_RESIDENT_BYTES = 32 * 2**20


@functools.lru_cache(maxsize=1024)
def _plan(n_rows: int, n_cols: int, *, interpreted: bool, n_sms: int, elem_bytes: int = 4) -> _Plan:
    """Block sizes, warps, program counts and cache hints (Note [tiles and programs]); pure."""
    block_d = triton.next_power_of_2(n_cols)
    rows_cap = triton.next_power_of_2(n_rows)
    if interpreted:
        # ~32k elements per tile: numpy does the work, per-program overhead is amortised.
        rows = min(_pow2_at_most(32768 // block_d), rows_cap)
        programs = min(-(-n_rows // rows), 2)
        # The GPU's row order for this width (below), so CI runs both orders' code.
        return _Plan(
            block_d,
            rows,
            1,
            rows,
            1,
            programs,
            triton.next_power_of_2(programs),
            block_d,
            bwd_reverse=block_d <= _REVERSE_MAX_BLOCK,
        )
    # GPU, chosen from a sweep on an H200 (float32, triton 3.6; scripts/bench_rmsnorm.py
    # --sweep): tiles of >= 4096 elements, so narrow rows come several to a program.
    # Forward: 32 values per thread. Backward: 16-32 per thread for each of x, dy and their
    # prefetched successors; 2 programs per SM up to d = 4096, 1 beyond (registers).
    rows = min(max(1, 4096 // block_d), 64, rows_cap)
    fwd_warps = _clamp(rows * block_d // 1024, 4, 32)
    bwd_rows = rows
    if block_d == 1024 and elem_bytes == 2:
        # 2-byte elements, same tiles: half the bytes per thread, so twice the forward's warps
        # and half the backward's (4096x1024 bf16, 9 reps: 20.4 -> 17.7 us fwd+bwd).
        fwd_warps, bwd_warps, per_sm = 2 * fwd_warps, 4, 2
    elif block_d <= 1024:
        bwd_warps, per_sm = 8, 2
    elif block_d == 2048:
        # Tiles of 4 rows, one program per SM: more bytes in flight per SM (4096x2048: 2.79
        # against 2.72 TB/s fwd+bwd for 2-row tiles at 2 per SM, 7 interleaved rounds;
        # 16384x1600 equal, 3.21).
        bwd_rows, bwd_warps, per_sm = min(4, rows_cap), 16, 1
    elif block_d == 4096:
        bwd_warps, per_sm = 4, 2
    else:
        bwd_warps, per_sm = _clamp(block_d // 512, 16, 32), 1
    # Note [cache hints]: x is read by the forward and again by the backward. When the
    # tensors fit in L2 (~60 MB on an H200) it pays to keep x there (evict_last) and to let y
    # and the backward's last-use loads go first; beyond that only evict_last on x helped.
    small = n_rows * n_cols * elem_bytes <= _L2_RESIDENT_BYTES
    hints = dict(
        x_evict="evict_last",
        y_evict="evict_first" if small else "",
        bwd_load_evict="evict_first" if small else "",
    )
    # The reverse walk (Note [reverse walk]) measured faster up to d = 4096 (4096x4096 3.04 ->
    # 3.12 TB/s, 4096x2048 2.83 -> 2.88, 16384x1600 3.21 -> 3.25, 4096x1024 equal; 7 interleaved
    # rounds), slower at 4096x8192 (3.22 -> 3.16), where x is far larger than the L2.
    plan = _gpu_plan(
        n_rows,
        n_cols,
        n_sms=n_sms,
        fwd_rows=rows,
        fwd_warps=fwd_warps,
        bwd_rows=bwd_rows,
        bwd_warps=bwd_warps,
        bwd_per_sm=per_sm,
        **hints,
    )
    return dataclasses.replace(plan, bwd_reverse=block_d <= _REVERSE_MAX_BLOCK)


@functools.lru_cache(maxsize=16)
def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


# Test hook: when set, outputs are allocated full of NaN instead of uninitialised, so an
# element a kernel forgot to write cannot pass a comparison by luck.
_POISON_OUTPUTS = False


@contextmanager
def _poisoned_outputs():
    global _POISON_OUTPUTS
    previous, _POISON_OUTPUTS = _POISON_OUTPUTS, True
    try:
        yield
    finally:
        _POISON_OUTPUTS = previous


def _empty(shape, *, dtype, device) -> torch.Tensor:
    if _POISON_OUTPUTS:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def _check_inputs(x: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        raise ValueError(
            f"x must be a tensor of shape (..., d), got {type(x).__name__} "
            f"with shape {tuple(getattr(x, 'shape', ()))}"
        )
    d = x.shape[-1]
    if not 1 <= d <= MAX_WIDTH:
        raise ValueError(f"width d=x.shape[-1]={d} must be in [1, {MAX_WIDTH}]")
    if weight.dim() != 1 or weight.shape[0] != d:
        raise ValueError(f"weight.shape={tuple(weight.shape)} must be ({d},) to match x.shape[-1]")
    for name, t in (("x", x), ("weight", weight)):
        if t.dtype not in _SUPPORTED_DTYPES:
            raise ValueError(
                f"{name}.dtype={t.dtype} is not supported; use one of "
                f"torch.float32, torch.bfloat16, torch.float16"
            )
    if x.device != weight.device:
        raise ValueError(f"x.device={x.device} and weight.device={weight.device} must be the same")
    if x.device.type != "cuda" and not (triton is not None and _interpreting()):
        raise ValueError(
            f"x.device={x.device}: Triton kernels need CUDA tensors, or "
            f"TRITON_INTERPRET=1 to interpret them on CPU"
        )
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps={eps} must be finite and >= 0")


def _as_rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a 2-D (rows, d) tensor with unit column stride, copying only if it must."""
    if t.stride(-1) != 1:
        t = t.contiguous()
    d = t.shape[-1]
    try:
        return t.view(-1, d)  # keeps a padded row stride (sliced views) without a copy
    except RuntimeError:
        return t.reshape(-1, d)


# Note [dependent launch]: on sm_90+ each kernel is launched with programmatic dependent launch
# (PDL): its programs may be scheduled while the kernel before it on the stream is finishing,
# and wait in ``gdc_wait`` (griddepcontrol.wait: the previous grid complete, its writes
# visible) before touching memory, then let the next kernel be scheduled in turn. What this
# hides is the ~1 us gap between dependent kernels (forward -> backward -> dweight reduction).
# Correctness does not depend on it: the wait comes before every load, and without PDL it is a
# no-op. A switch so benchmarks can time it.
_USE_PDL = True


@functools.lru_cache(maxsize=16)
def _pdl_supported(device: torch.device) -> bool:
    return (
        device.type == "cuda"
        and gdc_wait is not None
        and torch.cuda.get_device_capability(device)[0] >= 9
    )


def _dependent_launch(device: torch.device) -> bool:
    return _USE_PDL and _pdl_supported(device)


def _pdl_option(pdl: bool) -> dict:
    return {"launch_pdl": True} if pdl else {}


def _plan_of(x2: torch.Tensor) -> _Plan:
    """The launch plan for a (rows >= 1, d) input, forward and backward alike."""
    n_rows, n_cols = x2.shape
    return _plan(
        n_rows,
        n_cols,
        interpreted=x2.device.type != "cuda",
        n_sms=_sm_count(x2.device),
        elem_bytes=x2.element_size(),
    )


def _launcher(lazy: _LazyJit, grid, wrap):
    """``lazy[grid]``, or with ``wrap`` (``torch.library.wrap_triton``, Note [compiled callers])
    the wrapped ``triton.jit`` function: what Inductor traces."""
    return lazy[grid] if wrap is None else wrap(lazy.jitted())[grid]


def _launch_options(pdl: bool, num_warps: int, wrap) -> dict:
    # Inductor's launcher passes no dependent-launch option (Note [compiled callers]).
    return {"num_warps": num_warps, **({} if wrap is not None else _pdl_option(pdl))}


def _rms_norm_forward(x2, weight, eps, kernels, plan_override=None, compiled=None, wrap=None):
    """y and rstd of a (rows, d) input. ``compiled`` (a dict) receives the compiled kernel and
    its constexpr arguments (Note [host path]); ``wrap`` launches through a wrapper."""
    n_rows, n_cols = x2.shape
    y = _empty((n_rows, n_cols), dtype=x2.dtype, device=x2.device)
    rstd = _empty((n_rows,), dtype=torch.float32, device=x2.device)
    if n_rows == 0:
        return y, rstd
    p = plan_override or _plan_of(x2)
    grid = (-(-n_rows // p.fwd_rows),)  # not triton.cdiv: a JIT-callable, ~5 us per call
    pdl = wrap is None and _dependent_launch(x2.device)
    constexprs = dict(
        BLOCK_D=p.block_d, ROWS=p.fwd_rows, X_EVICT=p.x_evict, Y_EVICT=p.y_evict, PDL=pdl
    )
    kernel = _launcher(kernels.forward, grid, wrap)(
        x2, weight, y, rstd, x2.stride(0), y.stride(0), n_rows, n_cols, eps,
        **constexprs, **_launch_options(pdl, p.fwd_warps, wrap),
    )  # fmt: skip
    if compiled is not None:
        compiled["forward"] = (kernel, constexprs)
    return y, rstd


def _rms_norm_backward(
    dy2, x2, weight, rstd, kernels, plan_override=None, compiled=None, wrap=None
):
    """dx and dweight; ``compiled`` and ``wrap`` as for ``_rms_norm_forward``."""
    n_rows, n_cols = x2.shape
    dx = _empty((n_rows, n_cols), dtype=x2.dtype, device=x2.device)
    if n_rows == 0:
        return dx, torch.zeros_like(weight)
    p = plan_override or _plan_of(x2)
    partial = _empty((p.bwd_programs, n_cols), dtype=torch.float32, device=x2.device)
    dw = _empty((n_cols,), dtype=weight.dtype, device=x2.device)
    pdl = wrap is None and _dependent_launch(x2.device)
    bwd_constexprs = dict(
        BLOCK_D=p.block_d, ROWS=p.bwd_rows, LOAD_EVICT=p.bwd_load_evict, REVERSE=p.bwd_reverse,
        PDL=pdl,
    )  # fmt: skip
    bwd = _launcher(kernels.backward, (p.bwd_programs,), wrap)(
        x2, weight, dy2, rstd, dx, partial, x2.stride(0), dy2.stride(0), dx.stride(0), n_rows,
        n_cols, **bwd_constexprs, **_launch_options(pdl, p.bwd_warps, wrap),
    )  # fmt: skip
    red_constexprs = dict(BLOCK_P=p.red_block_p, BLOCK_N=p.red_block_n, PDL=pdl)
    red = _launcher(kernels.reduce_dweight, (-(-n_cols // p.red_block_n),), wrap)(
        partial, dw, p.bwd_programs, n_cols, **red_constexprs, **_launch_options(pdl, 4, wrap)
    )
    if compiled is not None:
        compiled["backward"] = (bwd, bwd_constexprs)
        compiled["reduce_dweight"] = (red, red_constexprs)
    return dx, dw


# --------------------------------------------------------------------------------------------
# Layer 2b: the host path.

# Note [host path]: in a model these kernels are small (a 1024x1600 float32 forward+backward is
# ~15 us of GPU time) and a call costs what the host spends on it. ``jitted[grid](...)``
# re-derives triton's specialisation key from every argument at every launch. That key depends
# only on the device, the options (num_warps, launch_pdl), the constexpr values, each tensor's
# dtype and 16-byte alignment, and each int's ``== 1`` / ``% 16 == 0`` / 32-bit-range classes.
# ``RMSNormFunction`` therefore keys a prepared call on everything that fixes those for its
# three launches -- x's and weight's shape, strides, dtypes, devices and alignment, eps, the
# kernels and the launch switch -- and, on a hit, allocates the outputs and calls each compiled
# kernel's launcher directly, its constexpr tail laid out in advance; x and dy are passed as they
# are (their row stride is part of the key), not viewed as rows. A miss (the first call of a
# signature), a tensor not on the current device, an installed launch hook (profilers), the
# interpreter, an x that cannot be viewed as rows without a copy, or a triton whose compiled
# kernels lack that launcher take the checked path through triton's own launch, which is also
# what records a prepared call. ``docs/rmsnorm-h200.md`` has what each piece costs.

_FAST_LAUNCH = True  # a switch so benchmarks can time triton's own launch path beside it
_PREPARED: dict = {}
_PREPARED_MAX = 1024  # signatures kept; the dict is emptied when full (shapes that never repeat)


class _NoFastPath(Exception):
    """This triton's compiled kernels cannot be launched directly (Note [host path])."""


_RUNTIME_KNOBS = getattr(getattr(triton, "knobs", None), "runtime", None)


def _launch_hooks_installed() -> bool:
    runtime = _RUNTIME_KNOBS
    if runtime is None:  # triton < 3.3: no knobs to read the hooks from
        return True
    enter = runtime.launch_enter_hook
    leave = runtime.launch_exit_hook
    # A hook is None, a callable, or a HookChain whose ``calls`` may be empty.
    return bool(getattr(enter, "calls", enter) or getattr(leave, "calls", leave))


class _Launch:
    """One compiled kernel, its grid and its constexpr arguments, launched without the binder."""

    __slots__ = ("function", "grid", "metadata", "run", "tail")

    def __init__(self, lazy: _LazyJit, captured, grid: int):
        kernel, constexprs = captured
        jitted = lazy._by_mode.get(False)
        params = getattr(jitted, "params", None)
        run = getattr(kernel, "run", None)
        if params is None or run is None or not hasattr(kernel, "packed_metadata"):
            raise _NoFastPath(f"{lazy.__name__}: no compiled launcher")
        names = [q.name for q in params if q.is_constexpr]
        plain = len(params) - len(names)
        if any(q.is_constexpr for q in params[:plain]) or set(names) != set(constexprs):
            raise _NoFastPath(f"{lazy.__name__}: constexpr parameters are not the last ones")
        self.run, self.function, self.metadata = run, kernel.function, kernel.packed_metadata
        self.grid = grid
        self.tail = tuple(constexprs[n] for n in names)

    def __call__(self, stream, *args):
        self.run(
            self.grid, 1, 1, stream, self.function, self.metadata, None, None, None,
            *args, *self.tail,
        )  # fmt: skip


class _Prepared:
    """A forward signature's launches, and its backward's per layout of dy (Note [host path])."""

    __slots__ = ("backward", "device", "forward", "n_cols", "n_rows", "plan", "x_stride")

    def __init__(self, x, x2, plan, forward):
        self.device = x.device.index
        self.n_rows, self.n_cols = x2.shape
        self.x_stride = x2.stride(0)
        self.plan = plan
        self.forward = forward
        self.backward: dict = {}  # (dy.stride(), dy aligned) -> (_Launch, _Launch, dy row stride)


def _fast_ok(device: int) -> bool:
    return torch._C._cuda_getDevice() == device and not _launch_hooks_installed()


def _remember(key, prep: _Prepared) -> None:
    if len(_PREPARED) >= _PREPARED_MAX:
        _PREPARED.clear()
    _PREPARED[key] = prep


# --------------------------------------------------------------------------------------------
# Layer 3: autograd.


class RMSNormFunction(torch.autograd.Function):
    """``rms_norm_reference(x, weight, eps)`` and its gradients, by Triton kernels.

    Equals the float64 oracle within ``RMSNORM_TOLERANCES[x.dtype]`` for ``x`` of shape
    ``(..., d)`` with ``1 <= d <= MAX_WIDTH``, float32/bfloat16/float16 storage (float32
    arithmetic), CUDA tensors or CPU tensors under ``TRITON_INTERPRET=1``. Any strides are
    accepted (a copy is made only where the last dimension is not contiguous or the leading
    dimensions cannot be flattened). ``apply(x, weight, eps, kernels=None)``: ``kernels`` is for
    mutants only. Repeated calls with the same signature take the prepared host path (Note
    [host path]).
    """

    @staticmethod
    def forward(ctx, x, weight, eps, kernels=None):
        kernels = kernels or _KERNELS
        key = None
        if _FAST_LAUNCH and x.is_cuda:
            eps = float(eps)
            key = (
                x.shape, x.stride(), x.dtype, x.device, (x.data_ptr() & 15) == 0,
                weight.shape, weight.stride(), weight.dtype, weight.device,
                (weight.data_ptr() & 15) == 0, eps, kernels, _USE_PDL,
            )  # fmt: skip
            prep = _PREPARED.get(key)
            if prep is not None and _fast_ok(prep.device):
                y = _empty(x.shape, dtype=x.dtype, device=x.device)
                rstd = _empty((prep.n_rows,), dtype=torch.float32, device=x.device)
                prep.forward(
                    torch._C._cuda_getCurrentRawStream(prep.device),
                    x, weight, y, rstd, prep.x_stride, prep.n_cols, prep.n_rows, prep.n_cols, eps,
                )  # fmt: skip
                ctx.save_for_backward(x, weight, rstd)
                ctx.kernels, ctx.plan, ctx.prep = kernels, prep.plan, prep
                return y
        _require_triton()
        eps = float(eps)
        _check_inputs(x, weight, eps)
        x2 = _as_rows(x)
        given = weight
        weight = weight.contiguous()  # the kernels read it with unit stride
        plan = _plan_of(x2) if x2.shape[0] else None  # planned once, for both passes
        compiled: dict | None = {} if key is not None and plan is not None else None
        y, rstd = _rms_norm_forward(x2, weight, eps, kernels, plan, compiled)
        prep = None
        # Prepared only where x2 is x viewed as rows (no copy; a non-empty copy has its own
        # storage) and weight needed no copy either.
        viewed = x2.data_ptr() == x.data_ptr()
        if compiled and weight is given and viewed and not _interpreting():
            try:
                launch = _Launch(
                    kernels.forward, compiled["forward"], -(-x2.shape[0] // plan.fwd_rows)
                )
            except _NoFastPath:
                pass
            else:
                prep = _Prepared(x, x2, plan, launch)
                _remember(key, prep)
        ctx.save_for_backward(x, weight, rstd)
        ctx.kernels, ctx.plan, ctx.prep = kernels, plan, prep
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        prep = ctx.prep
        dy_key = None
        if prep is not None:
            dy_key = (dy.stride(), (dy.data_ptr() & 15) == 0, dy.dtype)
            prepared = prep.backward.get(dy_key)
            if prepared is not None and _fast_ok(prep.device):
                launch_bwd, launch_red, dy_stride = prepared
                n_rows, n_cols, programs = prep.n_rows, prep.n_cols, prep.plan.bwd_programs
                dx = _empty(x.shape, dtype=x.dtype, device=x.device)
                partial = _empty((programs, n_cols), dtype=torch.float32, device=x.device)
                dw = _empty((n_cols,), dtype=weight.dtype, device=x.device)
                stream = torch._C._cuda_getCurrentRawStream(prep.device)
                launch_bwd(
                    stream, x, weight, dy, rstd, dx, partial, prep.x_stride, dy_stride, n_cols,
                    n_rows, n_cols,
                )  # fmt: skip
                launch_red(stream, partial, dw, programs, n_cols)
                return (dx if ctx.needs_input_grad[0] else None), dw, None, None
        x2 = _as_rows(x)
        dy2 = _as_rows(dy)
        compiled: dict | None = {} if dy_key is not None else None
        dx, dw = _rms_norm_backward(dy2, x2, weight, rstd, ctx.kernels, ctx.plan, compiled)
        if compiled and dy2.data_ptr() == dy.data_ptr():
            p = prep.plan
            try:
                prep.backward[dy_key] = (
                    _Launch(ctx.kernels.backward, compiled["backward"], p.bwd_programs),
                    _Launch(
                        ctx.kernels.reduce_dweight,
                        compiled["reduce_dweight"],
                        -(-prep.n_cols // p.red_block_n),
                    ),
                    dy2.stride(0),
                )
            except _NoFastPath:
                pass
        return (
            dx.view(x.shape) if ctx.needs_input_grad[0] else None,
            dw if ctx.needs_input_grad[1] else None,
            None,
            None,
        )


# Note [compiled callers]: ``torch.compile`` cannot trace the prepared host path (it calls
# triton's compiled launchers directly), so under compilation the same kernels are reached through
# two custom ops, ``paracheck::rms_norm_forward`` and ``paracheck::rms_norm_backward``
# (``torch.library.triton_op``, torch >= 2.6), their launches wrapped by ``wrap_triton`` so that
# Inductor sees the kernels and calls them from its own generated code, and CUDA graphs capture
# them with the rest of the graph. The ops use the same plans as eager calls, without dependent
# launch (an option Inductor's launcher does not pass). Eager calls do not go through them:
# a custom op's Python dispatch costs more host time than the whole prepared call.


def _register_ops():
    """The custom ops (Note [compiled callers]), registered at import (Dynamo cannot trace a
    registration); None where torch has no ``torch.library.triton_op`` or triton is absent."""
    triton_op = getattr(torch.library, "triton_op", None)
    wrap_triton = getattr(torch.library, "wrap_triton", None)
    if triton_op is None or wrap_triton is None or triton is None:
        return None

    @triton_op("paracheck::rms_norm_forward", mutates_args=())
    def forward_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> list[torch.Tensor]:
        y, rstd = _rms_norm_forward(_as_rows(x), weight, eps, _KERNELS, wrap=wrap_triton)
        return [y.view(x.shape), rstd]

    @triton_op("paracheck::rms_norm_backward", mutates_args=())
    def backward_op(
        dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor
    ) -> list[torch.Tensor]:
        dx, dw = _rms_norm_backward(
            _as_rows(dy), _as_rows(x), weight, rstd, _KERNELS, wrap=wrap_triton
        )
        return [dx.view(x.shape), dw]

    def setup_context(ctx, inputs, output):
        x, weight, _ = inputs
        ctx.save_for_backward(x, weight, output[1])

    def backward(ctx, grads):
        x, weight, rstd = ctx.saved_tensors
        dx, dw = torch.ops.paracheck.rms_norm_backward(grads[0], x, weight, rstd)
        return dx, dw, None

    torch.library.register_autograd(
        "paracheck::rms_norm_forward", backward, setup_context=setup_context
    )
    return torch.ops.paracheck.rms_norm_forward


try:
    _FORWARD_OP = _register_ops()
except RuntimeError:  # registered already (this file imported under a second module name)
    _FORWARD_OP = getattr(getattr(torch.ops, "paracheck", None), "rms_norm_forward", None)


def _compiled_call(x: torch.Tensor, weight: torch.Tensor, eps: float):
    """The custom-op call under ``torch.compile`` (Note [compiled callers]), or None."""
    op = _FORWARD_OP
    if op is None or not x.is_cuda:
        return None
    _check_inputs(x, weight, float(eps))
    return op(x, weight.contiguous(), float(eps))[0]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Functional form of ``RMSNormFunction``; under ``torch.compile``, custom ops (Note
    [compiled callers])."""
    if torch.compiler.is_compiling():
        y = _compiled_call(x, weight, eps)
        if y is not None:
            return y
    return RMSNormFunction.apply(x, weight, eps)


# --------------------------------------------------------------------------------------------
# Layer 4: module.


class TritonRMSNorm(torch.nn.Module):
    """RMSNorm over the last dimension: equals ``rms_norm_reference(x, self.weight, eps)``.

    Tolerances, supported widths, dtypes and devices are ``RMSNormFunction``'s. ``weight``
    starts at ones, like ``torch.nn.RMSNorm``.
    """

    def __init__(self, d_model: int, eps: float = 1e-5, *, device=None, dtype=None):
        super().__init__()
        if not 1 <= d_model <= MAX_WIDTH:
            raise ValueError(f"d_model={d_model} must be in [1, {MAX_WIDTH}]")
        self.d_model = d_model
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(d_model, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.d_model}, eps={self.eps}"
