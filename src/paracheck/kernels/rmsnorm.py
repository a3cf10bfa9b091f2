"""Triton RMSNorm, forward and backward, in four layers.

kernels (``@triton.jit``) -> launchers (plan, checks, allocation) -> ``RMSNormFunction``
(``torch.autograd.Function``) -> ``TritonRMSNorm`` (``nn.Module``). The specification is
``paracheck.oracle.rmsnorm.rms_norm_reference``; ``RMSNORM_TOLERANCES``
(``paracheck.oracle.tolerance``) says how close these kernels are to it.

The kernels and their lazy jit are ``paracheck.kernels._rmsnorm_kernels`` (Note [interpreter
mode]); the plan is ``paracheck.kernels._rmsnorm_plan``.

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

import functools
import math
from contextlib import contextmanager

import torch

# The kernels' and the plan's names are also reached here (mutants, benchmark scripts and
# experiments read ``rmsnorm.KERNELS``, ``rmsnorm.launch_plan``, ``rmsnorm.gpu_plan``).
from paracheck.kernels._rmsnorm_kernels import (  # noqa: F401
    KERNELS,
    LazyJit,
    RMSNormKernels,
    gdc_wait,
    interpreting,
    lazy_jit,
    require_triton,
    tl,
    triton,
    triton_available,
)
from paracheck.kernels._rmsnorm_ops import register_ops
from paracheck.kernels._rmsnorm_plan import (
    LaunchPlan,
    gpu_plan,  # noqa: F401
    launch_plan,
    sm_count,
)
from paracheck.oracle.tolerance import (
    RMSNORM_INTERPRETER_TOLERANCES,
    RMSNORM_TOLERANCES,
    RMSNormTolerance,
    rms_norm_tolerance,
    rounding_depth,
)

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


# Layer 1, the kernels, is ``paracheck.kernels._rmsnorm_kernels``.

# --------------------------------------------------------------------------------------------
# Layer 2: launchers. A pure plan, then checks, allocation and launches.


# The plan (pure) is ``paracheck.kernels._rmsnorm_plan``; checks, allocation and launches follow.


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
    if x.device.type != "cuda" and not (triton is not None and interpreting()):
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


def _plan_of(x2: torch.Tensor) -> LaunchPlan:
    """The launch plan for a (rows >= 1, d) input, forward and backward alike."""
    # int(): under symbolic tracing of the custom ops a size may be a SymInt; a plan is
    # compile-time constants, so it is specialised on (and guarded by) the concrete size.
    n_rows, n_cols = int(x2.shape[0]), int(x2.shape[1])
    return launch_plan(
        n_rows,
        n_cols,
        interpreted=x2.device.type != "cuda",
        n_sms=sm_count(x2.device),
        elem_bytes=x2.element_size(),
    )


def _launcher(lazy: LazyJit, grid, wrap):
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

    def __init__(self, lazy: LazyJit, captured, grid: int):
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
        kernels = kernels or KERNELS
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
        require_triton()
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
        if compiled and weight is given and viewed and not interpreting():
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
# custom ops (``paracheck.kernels._rmsnorm_ops``): ``paracheck::rms_norm_forward`` with its
# autograd, whose backward is ``paracheck::rms_norm_backward``. Where torch has
# ``torch.library.triton_op`` (>= 2.6) their launches are wrapped by ``wrap_triton`` so that
# Inductor sees the kernels and calls them from its own generated code, and CUDA graphs capture
# them with the rest of the graph; the interpreter, which cannot be traced, and older torch go
# through opaque twins (``..._opaque``, ``torch.library.custom_op``) with fake implementations.
# Either way the compiled graph holds the norm as one op and has no break at it. The ops use the
# same plans as eager calls, without dependent launch (an option Inductor's launcher does not
# pass). Eager calls do not go through them: a custom op's Python dispatch costs more host time
# than the whole prepared call.


def _check_op_inputs(x, weight, eps):
    require_triton()
    _check_inputs(x, weight, float(eps))


def _op_forward(x, weight, eps, wrap):
    y, rstd = _rms_norm_forward(_as_rows(x), weight, eps, KERNELS, wrap=wrap)
    return y.view(x.shape), rstd


def _op_backward(dy, x, weight, rstd, wrap):
    dx, dw = _rms_norm_backward(_as_rows(dy), _as_rows(x), weight, rstd, KERNELS, wrap=wrap)
    return dx.view(x.shape), dw


try:  # registered at import: Dynamo cannot trace a registration
    _FORWARD_OP = register_ops(_op_forward, _op_backward, _check_op_inputs)
except RuntimeError:  # registered already (this file imported under a second module name)
    _ops = getattr(torch.ops, "paracheck", None)
    _FORWARD_OP = getattr(_ops, "rms_norm_forward", None) or getattr(
        _ops, "rms_norm_forward_opaque", None
    )


def _compiled_call(x: torch.Tensor, weight: torch.Tensor, eps: float):
    """The custom-op call under ``torch.compile`` (Note [compiled callers]), or None where no
    op is registered. The op checks the inputs as eager calls check them."""
    op = _FORWARD_OP
    if op is None:
        return None
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
