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
        _require_triton()
        mode = _interpreting()
        jitted = self._by_mode.get(mode)
        if jitted is None:
            jitted = self._by_mode[mode] = triton.jit(self.fn)
        return jitted[grid]


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
    if block_d <= 1024:
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


def _rms_norm_forward(x2, weight, eps, kernels, plan_override=None):
    n_rows, n_cols = x2.shape
    y = _empty((n_rows, n_cols), dtype=x2.dtype, device=x2.device)
    rstd = _empty((n_rows,), dtype=torch.float32, device=x2.device)
    if n_rows == 0:
        return y, rstd
    p = plan_override or _plan_of(x2)
    grid = (-(-n_rows // p.fwd_rows),)  # not triton.cdiv: a JIT-callable, ~5 us per call
    pdl = _dependent_launch(x2.device)
    kernels.forward[grid](
        x2,
        weight,
        y,
        rstd,
        x2.stride(0),
        y.stride(0),
        n_rows,
        n_cols,
        eps,
        BLOCK_D=p.block_d,
        ROWS=p.fwd_rows,
        X_EVICT=p.x_evict,
        Y_EVICT=p.y_evict,
        PDL=pdl,
        num_warps=p.fwd_warps,
        **_pdl_option(pdl),
    )
    return y, rstd


def _rms_norm_backward(dy2, x2, weight, rstd, kernels, plan_override=None):
    n_rows, n_cols = x2.shape
    dx = _empty((n_rows, n_cols), dtype=x2.dtype, device=x2.device)
    if n_rows == 0:
        return dx, torch.zeros_like(weight)
    p = plan_override or _plan_of(x2)
    partial = _empty((p.bwd_programs, n_cols), dtype=torch.float32, device=x2.device)
    dw = _empty((n_cols,), dtype=weight.dtype, device=x2.device)
    pdl = _dependent_launch(x2.device)
    kernels.backward[(p.bwd_programs,)](
        x2,
        weight,
        dy2,
        rstd,
        dx,
        partial,
        x2.stride(0),
        dy2.stride(0),
        dx.stride(0),
        n_rows,
        n_cols,
        BLOCK_D=p.block_d,
        ROWS=p.bwd_rows,
        LOAD_EVICT=p.bwd_load_evict,
        REVERSE=p.bwd_reverse,
        PDL=pdl,
        num_warps=p.bwd_warps,
        **_pdl_option(pdl),
    )
    kernels.reduce_dweight[(-(-n_cols // p.red_block_n),)](
        partial,
        dw,
        p.bwd_programs,
        n_cols,
        BLOCK_P=p.red_block_p,
        BLOCK_N=p.red_block_n,
        PDL=pdl,
        num_warps=4,
        **_pdl_option(pdl),
    )
    return dx, dw


# --------------------------------------------------------------------------------------------
# Layer 3: autograd.


class RMSNormFunction(torch.autograd.Function):
    """``rms_norm_reference(x, weight, eps)`` and its gradients, by Triton kernels.

    Equals the float64 oracle within ``RMSNORM_TOLERANCES[x.dtype]`` for ``x`` of shape
    ``(..., d)`` with ``1 <= d <= MAX_WIDTH``, float32/bfloat16/float16 storage (float32
    arithmetic), CUDA tensors or CPU tensors under ``TRITON_INTERPRET=1``. Any strides are
    accepted (a copy is made only where the last dimension is not contiguous or the leading
    dimensions cannot be flattened). ``apply(x, weight, eps, kernels=None)``: ``kernels`` is for
    mutants only.
    """

    @staticmethod
    def forward(ctx, x, weight, eps, kernels=None):
        _require_triton()
        eps = float(eps)
        _check_inputs(x, weight, eps)
        kernels = kernels or _KERNELS
        x2 = _as_rows(x)
        weight = weight.contiguous()  # the kernels read it with unit stride
        plan = _plan_of(x2) if x2.shape[0] else None  # planned once, for both passes
        y, rstd = _rms_norm_forward(x2, weight, eps, kernels, plan)
        ctx.save_for_backward(x2, weight, rstd)
        ctx.kernels, ctx.plan = kernels, plan
        ctx.x_shape = x.shape
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2, weight, rstd = ctx.saved_tensors
        dx, dw = _rms_norm_backward(_as_rows(dy), x2, weight, rstd, ctx.kernels, ctx.plan)
        return (
            dx.view(ctx.x_shape) if ctx.needs_input_grad[0] else None,
            dw if ctx.needs_input_grad[1] else None,
            None,
            None,
        )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Functional form of ``RMSNormFunction``."""
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
        return RMSNormFunction.apply(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.d_model}, eps={self.eps}"
