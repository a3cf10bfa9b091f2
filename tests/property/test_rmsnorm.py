"""Triton RMSNorm equals the float64 oracle ``paracheck.oracle.rmsnorm`` (forward, dx, dweight).

On a machine without CUDA the kernels run in the Triton interpreter: ``TRITON_INTERPRET`` is set
below before any kernel is decorated (paracheck.kernels decorates at first launch). The
interpreter costs ~1.6 ms per program instance, so cases are size-weighted: the number of
elements per example is capped, wide rows come with few rows.

Every input lives inside a buffer of NaN (guards on both sides, NaN padding between the rows of
sliced views), so a kernel that reads outside its row produces NaN; outputs are allocated full
of NaN, so an element a kernel forgot to write fails too. NaN never passes a bound.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from dataclasses import dataclass  # noqa: E402

import pytest  # noqa: E402

pytest.importorskip("triton", reason="the RMSNorm kernels need triton (pip install triton)")

from hypothesis import HealthCheck, Phase, example, find, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from paracheck.kernels.rmsnorm import (  # noqa: E402
    MAX_WIDTH,
    TritonRMSNorm,
    _poisoned_outputs,
    interpreting,
    rms_norm,
    rms_norm_tolerance,
    rounding_depth,
)
from paracheck.mutants.rmsnorm import RMSNORM_MUTANTS  # noqa: E402
from paracheck.oracle.rmsnorm import rms_norm_reference, rms_norm_reference_grads  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
INTERPRETED = DEVICE == "cpu"
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
LAYOUTS = ("contiguous", "sliced", "transposed", "batched")
# Interpreter budget: elements per example (x, dy, dx, y each this big). On a GPU, bigger.
MAX_ELEMENTS = 2**16 if INTERPRETED else 2**22
_U32 = 2.0**-24


# ------------------------------------------------------------------------------------------
# Cases and their inputs.


@dataclass(frozen=True)
class RMSNormCase:
    rows: int
    width: int
    dtype: torch.dtype
    weight_dtype: torch.dtype
    layout: str  # how x and dy are laid out in memory; see _layout
    x_scale: float  # rows with mean(x^2) ~ eps expose epsilon bugs
    eps: float
    seed: int


@st.composite
def rms_norm_cases(
    draw,
    *,
    max_elements=MAX_ELEMENTS,
    max_rows=4096,
    max_width=16384,
    dtypes=DTYPES,
    layouts=LAYOUTS,
):
    """Cases whose rows * width stays under ``max_elements``; shrink toward one small row."""
    if not 1 <= max_width <= MAX_WIDTH:
        raise ValueError(f"max_width={max_width} must be in [1, {MAX_WIDTH}]")
    width = draw(
        st.one_of(
            st.integers(1, min(64, max_width)),
            st.sampled_from(
                [
                    w
                    for w in (127, 1000, 1023, 1024, 1025, 1600, 4097, 12345, 16384)
                    if w <= max_width
                ]
            ),
            st.integers(1, max_width),
        )
    )
    rows = draw(st.integers(1, max(1, min(max_rows, max_elements // width))))
    dtype = draw(st.sampled_from(dtypes))
    weight_dtype = draw(st.sampled_from([dtype, torch.float32]))
    return RMSNormCase(
        rows=rows,
        width=width,
        dtype=dtype,
        weight_dtype=weight_dtype,
        layout=draw(st.sampled_from(layouts)),
        x_scale=draw(st.sampled_from([1.0, 1e-3, 30.0])),
        eps=draw(st.sampled_from([1e-5, 1e-6, 1e-2])),
        seed=draw(st.integers(0, 2**16)),
    )


def _guarded(n: int, guard: int, dtype) -> torch.Tensor:
    """A length-``n`` view into a NaN buffer with ``guard`` NaNs on each side."""
    buf = torch.full((n + 2 * guard,), float("nan"), dtype=dtype, device=DEVICE)
    return buf[guard : guard + n]


def _layout(values: torch.Tensor, layout: str, guard: int) -> torch.Tensor:
    """``values`` (rows, width) copied into a guarded buffer with the given memory layout."""
    rows, width = values.shape
    if layout == "contiguous":
        out = _guarded(rows * width, guard, values.dtype).view(rows, width)
    elif layout == "sliced":  # rows padded with NaN: row stride width + 3
        out = _guarded(rows * (width + 3), guard, values.dtype).view(rows, width + 3)[:, :width]
    elif layout == "transposed":  # column-major: the last dimension is not contiguous
        out = _guarded(rows * width, guard, values.dtype).view(width, rows).t()
    elif layout == "batched":  # (2, rows/2, width), or (rows, 1, width)
        shape = (2, rows // 2, width) if rows % 2 == 0 else (rows, 1, width)
        out = _guarded(rows * width, guard, values.dtype).view(shape)
        out.copy_(values.view(shape))
        return out
    else:
        raise ValueError(f"layout={layout!r} is not one of {LAYOUTS}")
    out.copy_(values)
    return out


def make_inputs(case: RMSNormCase):
    """``(x, weight, dy)`` on DEVICE, each inside a NaN-guarded buffer."""
    g = torch.Generator().manual_seed(case.seed)
    guard = 1 << case.width.bit_length()  # >= the kernel's padded block width
    x = torch.randn(case.rows, case.width, generator=g) * case.x_scale
    dy = torch.randn(case.rows, case.width, generator=g)
    w = 1.0 + torch.randn(case.width, generator=g)  # mixed signs, a few near zero
    x = _layout(x.to(case.dtype).to(DEVICE), case.layout, guard)
    dy = _layout(dy.to(case.dtype).to(DEVICE), case.layout, guard)
    weight = _guarded(case.width, guard, case.weight_dtype)
    weight.copy_(w.to(case.weight_dtype))
    return x, weight, dy


# ------------------------------------------------------------------------------------------
# The check: errors against the float64 oracle, bounded element-wise.


def _violations(name, got, ref, scale, depth, tol) -> list[str]:
    """Elements where |got - ref| exceeds the tolerance; NaN always counts."""
    err = (got.double() - ref).abs()
    bound = tol.output_rel * ref.abs() + 2 * depth * _U32 * scale + tol.atol
    bad = ~(err <= bound)  # NaN compares False, so it is bad
    if not bool(bad.any()):
        return []
    i = int(torch.nonzero(bad.reshape(-1))[0])
    return [
        f"{name}: {int(bad.sum())}/{bad.numel()} elements out of bound; first at flat index "
        f"{i}: got {got.reshape(-1)[i].item()!r}, oracle {ref.reshape(-1)[i].item()!r}, "
        f"bound {bound.reshape(-1)[i].item():.3g}"
    ]


def check_rms_norm(fn, case: RMSNormCase) -> list[str]:
    """What ``fn(x, weight, eps)`` gets wrong on ``case`` against the oracle ([] if nothing).

    The oracle is evaluated on float64 copies of the inputs, so it is the exact value up to
    float64 rounding; the bounds are ``RMSNormTolerance``'s, with error scales that account for
    cancellation (dx) and for the length of each reduction (``rounding_depth``).
    """
    x, weight, dy = make_inputs(case)
    x.requires_grad_(True)
    weight.requires_grad_(True)
    with _poisoned_outputs():
        y = fn(x, weight, case.eps)
        y.backward(dy, retain_graph=True)
        first = (x.grad, weight.grad)
        x.grad = weight.grad = None
        y.backward(dy)  # again through the same forward: same bits (deterministic, re-entrant)
    problems = []
    if all(g is not None for g in (*first, x.grad, weight.grad)):
        for name, a, b in (("dx", first[0], x.grad), ("dweight", first[1], weight.grad)):
            if not torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)):
                problems.append(f"{name} differs between two backward passes through one forward")
    if y.shape != x.shape or y.dtype != x.dtype:
        problems.append(f"y has shape {tuple(y.shape)} {y.dtype}, x {tuple(x.shape)} {x.dtype}")
    if x.grad is None or weight.grad is None:
        return problems + ["a gradient is missing"]
    if x.grad.dtype != x.dtype or weight.grad.dtype != weight.dtype:
        problems.append(f"grad dtypes {x.grad.dtype}, {weight.grad.dtype} differ from inputs")
    x64, w64, dy64 = x.detach().double(), weight.detach().double(), dy.double()
    y_ref = rms_norm_reference(x64, w64, case.eps)
    dx_ref, dw_ref = rms_norm_reference_grads(x64, w64, dy64, case.eps)
    rstd = torch.rsqrt(x64.square().mean(-1, keepdim=True) + case.eps)
    xhat = x64 * rstd
    wdy = (w64 * dy64).abs()
    dx_scale = rstd * (wdy + xhat.abs() * (xhat.abs() * wdy).mean(-1, keepdim=True))
    dw_scale = (dy64 * xhat).abs().reshape(-1, case.width).sum(0)
    d_depth = rounding_depth(case.width)
    interp = interpreting()
    tol_x = rms_norm_tolerance(x.dtype, interpreted=interp)
    tol_w = rms_norm_tolerance(weight.dtype, interpreted=interp)
    problems += _violations("y", y.detach(), y_ref, y_ref.abs(), d_depth, tol_x)
    problems += _violations("dx", x.grad, dx_ref, dx_scale, d_depth, tol_x)
    problems += _violations(
        "dweight", weight.grad, dw_ref, dw_scale, d_depth + rounding_depth(case.rows), tol_w
    )
    return problems


def _assert_matches(fn, case):
    problems = check_rms_norm(fn, case)
    assert not problems, f"{case}:\n" + "\n".join(problems)


_SETTINGS = dict(
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# ------------------------------------------------------------------------------------------
# Properties.

_F32, _BF16, _F16 = torch.float32, torch.bfloat16, torch.float16


@settings(max_examples=200 if INTERPRETED else 100, **_SETTINGS)
@given(rms_norm_cases())
@example(RMSNormCase(1, 1, _F32, _F32, "contiguous", 1.0, 1e-5, 0))  # width 1: dx ~ 0
@example(RMSNormCase(3, 16384, _BF16, _BF16, "contiguous", 1.0, 1e-5, 1))  # widest, few rows
@example(RMSNormCase(4096, 7, _F16, _F16, "sliced", 1e-3, 1e-5, 2))  # many rows, eps matters
@example(RMSNormCase(40, 1600, _F32, _F32, "contiguous", 1.0, 1e-5, 3))  # 2 backward programs
def test_rms_norm_matches_oracle(case):
    """Forward, dx and dweight equal the float64 oracle within the dtype's tolerance."""
    _assert_matches(rms_norm, case)


@settings(max_examples=60 if INTERPRETED else 30, **_SETTINGS)
@given(rms_norm_cases(layouts=("sliced", "transposed", "batched")))
def test_non_contiguous_inputs_match_oracle(case):
    """Strided x and dy (padded rows, column-major, 3-D) equal the oracle like contiguous ones."""
    _assert_matches(rms_norm, case)


def test_module_matches_oracle():
    """TritonRMSNorm on a (batch, seq, d) input equals the oracle, gradients included."""
    torch.manual_seed(0)
    module = TritonRMSNorm(96, eps=1e-6, device=DEVICE, dtype=torch.float32)
    with torch.no_grad():
        module.weight.normal_()
    x = torch.randn(2, 5, 96, device=DEVICE, requires_grad=True)
    dy = torch.randn(2, 5, 96, device=DEVICE)
    module(x).backward(dy)
    y_ref = rms_norm_reference(x.double(), module.weight.double(), 1e-6)
    dx_ref, dw_ref = rms_norm_reference_grads(x.double(), module.weight.double(), dy.double(), 1e-6)
    torch.testing.assert_close(module(x).double(), y_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(x.grad.double(), dx_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(module.weight.grad.double(), dw_ref, rtol=1e-5, atol=1e-5)
    assert "96, eps=1e-06" in repr(module)


def test_strided_weight_matches_oracle():
    """A weight that is a strided view (every other element) gives the oracle's y and grads."""
    torch.manual_seed(1)
    x = torch.randn(7, 33, device=DEVICE, requires_grad=True)
    weight = torch.randn(66, device=DEVICE)[::2].requires_grad_(True)
    dy = torch.randn(7, 33, device=DEVICE)
    y = rms_norm(x, weight, 1e-5)
    y.backward(dy)
    dx_ref, dw_ref = rms_norm_reference_grads(x.double(), weight.double(), dy.double(), 1e-5)
    torch.testing.assert_close(
        y.double(), rms_norm_reference(x.double(), weight.double(), 1e-5), rtol=1e-5, atol=1e-6
    )
    torch.testing.assert_close(x.grad.double(), dx_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(weight.grad.double(), dw_ref, rtol=1e-5, atol=1e-5)


def test_alignment_changing_between_calls_matches_oracle():
    """Inputs 16-byte aligned, then not, then aligned again (views at element offsets 0, 1, 0,
    3) all equal the oracle: on a GPU each alignment needs its own compiled specialisation, and
    reusing the aligned one for an unaligned pointer would fault or misread."""
    torch.manual_seed(2)
    buf = torch.randn(8 * 32 + 3, device=DEVICE)
    dy = torch.randn(8, 32, device=DEVICE)
    for offset in (0, 1, 0, 3):
        x = buf[offset : offset + 8 * 32].view(8, 32).detach().requires_grad_(True)
        w = torch.randn(35, device=DEVICE)[offset : offset + 32].detach().requires_grad_(True)
        y = rms_norm(x, w, 1e-5)
        y.backward(dy)
        x64, w64 = x.detach().double(), w.detach().double()
        dx_ref, dw_ref = rms_norm_reference_grads(x64, w64, dy.double(), 1e-5)
        torch.testing.assert_close(
            y.double(), rms_norm_reference(x64, w64, 1e-5), rtol=1e-5, atol=1e-6
        )
        torch.testing.assert_close(x.grad.double(), dx_ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(w.grad.double(), dw_ref, rtol=1e-5, atol=1e-5)


GPU_ONLY = pytest.mark.skipif(
    INTERPRETED, reason="compiled kernels, direct launches, torch.compile and CUDA graphs need CUDA"
)


@GPU_ONLY
@settings(max_examples=60, **_SETTINGS)
@given(rms_norm_cases())
def test_prepared_path_matches_oracle(case):
    """After one call of the same signature, the forward takes the prepared host path (Note
    [host path]); the checked backward records the backward's, which the second backward of
    ``check_rms_norm`` takes and must equal bitwise."""

    def warm_then_call(x, weight, eps):
        rms_norm(x.detach(), weight.detach(), eps)
        return rms_norm(x, weight, eps)

    _assert_matches(warm_then_call, case)


@GPU_ONLY
def test_prepared_path_is_taken_and_equals_the_checked_path(monkeypatch):
    """Once a signature is recorded, neither the checked launchers nor triton's launch run, and
    the outputs and gradients are bitwise those of the checked path."""
    from paracheck.kernels import rmsnorm as K

    torch.manual_seed(5)
    x = torch.randn(3, 70, 1600, device=DEVICE, requires_grad=True)
    w = torch.randn(1600, device=DEVICE, requires_grad=True)
    dy = torch.randn(3, 70, 1600, device=DEVICE)

    def run():
        x.grad = w.grad = None
        y = rms_norm(x, w, 1e-5)
        y.backward(dy)
        return y.detach().clone(), x.grad.clone(), w.grad.clone()

    checked = run()  # records the signature

    def refuse(*a, **k):
        raise AssertionError("the checked path ran on a prepared signature")

    monkeypatch.setattr(K, "_rms_norm_forward", refuse)
    monkeypatch.setattr(K, "_rms_norm_backward", refuse)
    monkeypatch.setattr(K.LazyJit, "__getitem__", refuse)
    prepared = run()
    for a, b in zip(checked, prepared):
        assert torch.equal(a, b)


def _block(norm: str, d: int = 256):
    from paracheck.workloads.lm import Block, LMSpec

    spec = LMSpec(vocab_size=64, context_length=32, d_model=d, d_ff=4 * d, num_layers=1,
                  num_heads=4, norm=norm)  # fmt: skip
    torch.manual_seed(0)
    return Block(spec).to(DEVICE)


@GPU_ONLY
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_block_with_triton_norm_compiles_without_graph_break(dtype):
    """A transformer block using the kernel compiles with ``fullgraph=True`` (a graph break
    raises) through the custom ops (Note [compiled callers]), and its forward and gradients
    equal the eager block's within the dtype's rounding of one matrix product chain."""
    block = _block("triton").to(dtype)
    x = torch.randn(2, 32, 256, device=DEVICE, dtype=dtype, requires_grad=True)
    dy = torch.randn(2, 32, 256, device=DEVICE, dtype=dtype)
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True)

    def run(f):
        x.grad = None
        block.zero_grad(set_to_none=True)
        y = f(x)
        y.backward(dy)
        return [y.detach().double(), x.grad.double()] + [
            p.grad.double() for p in block.parameters()
        ]

    want, got = run(block), run(compiled)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    for a, b in zip(want, got):
        assert ((a - b).norm() / a.norm().clamp_min(1e-30)).item() <= tol


@GPU_ONLY
def test_forward_backward_is_captured_by_a_cuda_graph():
    """The prepared path runs under CUDA graph capture; replaying on new inputs gives bitwise
    the eager result."""
    norm = TritonRMSNorm(1600).to(DEVICE)
    static_x = torch.randn(256, 1600, device=DEVICE, requires_grad=True)
    static_dy = torch.randn(256, 1600, device=DEVICE)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm up: compile and record the signature outside the capture
            static_x.grad = norm.weight.grad = None
            norm(static_x).backward(static_dy)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    static_x.grad = norm.weight.grad = None
    with torch.cuda.graph(graph):
        static_y = norm(static_x)
        static_y.backward(static_dy)
    for seed in (1, 2):
        g = torch.Generator(device=DEVICE).manual_seed(seed)
        x_new = torch.randn(256, 1600, device=DEVICE, generator=g)
        dy_new = torch.randn(256, 1600, device=DEVICE, generator=g)
        with torch.no_grad():
            static_x.copy_(x_new)
            static_dy.copy_(dy_new)
        graph.replay()
        xe = x_new.clone().requires_grad_(True)
        we = norm.weight.detach().clone().requires_grad_(True)
        ye = rms_norm(xe, we, norm.eps)
        ye.backward(dy_new)
        assert torch.equal(static_y, ye)
        assert torch.equal(static_x.grad, xe.grad)
        assert torch.equal(norm.weight.grad, we.grad)


def test_empty_batch_gives_empty_outputs():
    """Zero rows: y and dx are empty, dweight is zero (the oracle's sum over no rows)."""
    x = torch.zeros(0, 8, device=DEVICE, requires_grad=True)
    w = torch.ones(8, device=DEVICE, requires_grad=True)
    rms_norm(x, w).sum().backward()
    assert x.grad.shape == (0, 8) and torch.equal(w.grad, torch.zeros(8, device=DEVICE))


# ------------------------------------------------------------------------------------------
# The properties kill every mutant.


@pytest.mark.parametrize("name", sorted(RMSNORM_MUTANTS))
def test_mutant_is_killed(name):
    """Hypothesis finds a case where the mutant's output differs from the oracle."""
    mutant = RMSNORM_MUTANTS[name]
    # Layouts keep every input inside its NaN guard: the unmasked mutant reads past the row,
    # and a transposed input's contiguous copy would have no guard around it.
    cases = rms_norm_cases(layouts=("contiguous", "sliced"))
    found = find(
        cases,
        lambda case: bool(check_rms_norm(mutant, case)),
        settings=settings(max_examples=150, phases=[Phase.generate], derandomize=True, **_SETTINGS),
    )
    assert check_rms_norm(mutant, found)


# ------------------------------------------------------------------------------------------
# Refused inputs name the argument and its value.


@pytest.mark.parametrize("width", [0, MAX_WIDTH + 1])
def test_unsupported_width_is_refused(width):
    """A width outside [1, MAX_WIDTH] raises ValueError naming d and its value."""
    x = torch.zeros(2, width, device=DEVICE)
    w = torch.ones(width, device=DEVICE)
    with pytest.raises(ValueError, match=rf"d=x.shape\[-1\]={width} must be in \[1, {MAX_WIDTH}\]"):
        rms_norm(x, w)
    with pytest.raises(ValueError, match=rf"d_model={width}"):
        TritonRMSNorm(width)


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32])
def test_unsupported_dtype_is_refused(dtype):
    """float64 and integer inputs raise ValueError naming x.dtype."""
    x = torch.zeros(2, 8, device=DEVICE, dtype=dtype)
    with pytest.raises(ValueError, match=rf"x.dtype={dtype} is not supported"):
        rms_norm(x, torch.ones(8, device=DEVICE))
    with pytest.raises(ValueError, match=rf"weight.dtype={dtype} is not supported"):
        rms_norm(torch.zeros(2, 8, device=DEVICE), torch.ones(8, device=DEVICE, dtype=dtype))


def test_mismatched_weight_is_refused():
    """A weight whose shape is not (d,) raises ValueError naming weight.shape."""
    with pytest.raises(ValueError, match=r"weight.shape=\(7,\) must be \(8,\)"):
        rms_norm(torch.zeros(2, 8, device=DEVICE), torch.ones(7, device=DEVICE))


def test_bad_eps_is_refused():
    """A negative or non-finite eps raises ValueError naming eps."""
    with pytest.raises(ValueError, match=r"eps=-1.0 must be finite and >= 0"):
        rms_norm(torch.zeros(2, 8, device=DEVICE), torch.ones(8, device=DEVICE), -1.0)


def test_device_mismatch_is_refused():
    """x and weight on different devices raise ValueError naming both devices."""
    other = "meta"
    with pytest.raises(ValueError, match=r"x.device=.* and weight.device=meta must be the same"):
        rms_norm(torch.zeros(2, 8, device=DEVICE), torch.ones(8, device=other))


def test_benchmark_measurement_checks_every_variant_against_the_oracle():
    """The measuring code shared with the asv GPU tier checks and times each variant and
    reports the ratios the benchmark tracks (on CPU: interpreter, wall clock, code paths only)."""
    from paracheck.bench.rmsnorm import measure_rmsnorm

    (r,) = measure_rmsnorm(
        device=DEVICE, shapes=[(8, 100)], compile=False, reps=3, copy_elements=2**12
    )
    assert (r.rows, r.d) == (8, 100)
    assert set(r.tbps) == {"triton", "F.rms_norm", "eager"}
    assert all(v > 0 for v in r.tbps.values()) and r.copy_tbps > 0
    d = r.to_dict()
    assert d["triton_vs_torch"] == r.tbps["triton"] / r.tbps["F.rms_norm"]
    assert d["triton_fraction_of_copy"] == r.tbps["triton"] / r.copy_tbps


def test_benchmark_measures_bfloat16_back_to_back_and_feeds_the_asv_tracks():
    """The asv GPU tier's rows: per shape and dtype, GPU and back-to-back time of every variant,
    and each track of ``benchmarks/gpu/rmsnorm.py`` reads its ratio from them (Liger-Kernel's
    n/a where it was not measured)."""
    from benchmarks.gpu import rmsnorm as asv_rmsnorm
    from paracheck.bench.asvtools import key
    from paracheck.bench.rmsnorm import LIGER, measure_rmsnorm

    (r,) = measure_rmsnorm(
        device=DEVICE,
        shapes=[(8, 100)],
        compile=False,
        reps=3,
        copy_elements=2**12,
        dtype=torch.bfloat16,
        loop=True,
        liger=False,
    )
    assert r.dtype == "bfloat16" and set(r.loop_us) == set(r.tbps) and LIGER not in r.tbps
    d = r.to_dict()
    assert d["triton_vs_torch_loop"] == r.loop_us["F.rms_norm"] / r.loop_us["triton"]
    results = {key(8, 100, "bfloat16"): d}
    bench = asv_rmsnorm.RMSNorm()
    bench.setup(results, "8x100", "bfloat16")
    assert bench.track_loop_time_vs_f_rms_norm(results, "8x100", "bfloat16") == pytest.approx(
        r.loop_us["triton"] / r.loop_us["F.rms_norm"]
    )
    assert bench.track_time_vs_f_rms_norm(results, "8x100", "bfloat16") == pytest.approx(
        r.tbps["F.rms_norm"] / r.tbps["triton"]
    )
    with pytest.raises(NotImplementedError, match="not measured"):
        bench.track_time_vs_liger(results, "8x100", "bfloat16")


def test_lm_with_triton_norm_trains_like_the_float64_lm():
    """The CS336 LM with ``norm="triton"`` gives loss and gradients as close to the float64 LM
    (``norm="torch"``, same weights) as the float32 LM with ``F.rms_norm`` does: norm-wise
    relative error at most twice F.rms_norm's, plus float32's unit roundoff."""
    from paracheck.workloads import build_model
    from paracheck.workloads.lm import LMSpec

    spec = LMSpec(vocab_size=32, context_length=8, d_model=48, d_ff=96, num_layers=2, num_heads=4)
    reference = build_model(spec, seed=3, dtype=torch.float64, device=DEVICE)
    tokens = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(4)).to(DEVICE)

    def loss_and_grads(model):
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 32), tokens[:, 1:].reshape(-1))
        loss.backward()
        return torch.cat(
            [loss.detach().double().reshape(1)]
            + [p.grad.double().reshape(-1) for p in model.parameters()]
        )

    want = loss_and_grads(reference)
    errors = {}
    for norm in ("torch", "triton"):
        model = build_model(
            LMSpec(**{**spec.__dict__, "norm": norm}), seed=3, dtype=torch.float32, device=DEVICE
        )
        model.load_state_dict(reference.state_dict())
        got = loss_and_grads(model)
        errors[norm] = ((got - want).norm() / want.norm()).item()
    assert errors["triton"] <= 2 * errors["torch"] + _U32, errors
