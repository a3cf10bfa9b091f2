"""RMSNorm forward+backward effective bandwidth, next to its peers in the same run.

Shared by the asv GPU tier (``benchmarks/gpu/rmsnorm.py``) and ``scripts/bench_rmsnorm.py``.
Effective bandwidth counts x, y, dy and dx once each (``4 * rows * d * element_size`` bytes)
over the median time of one forward+backward, gradients reset to None before each call (so no
accumulation kernel runs). Every variant is first checked against the float64 oracle on the
same inputs, and the device copy bandwidth is measured by the same timer as the ceiling.

Note [timing]: ``events_ms`` is the timer of record. Before each call it flushes the L2 by
READING a 256 MiB buffer and holds the GPU with ``torch.cuda._sleep`` so that the host has queued
the whole call before it starts: what it times is GPU time, launch gaps included.
``triton.testing.do_bench`` flushes by WRITING zeros: the L2 (~50 MB) is then full of dirty
lines whose write-back is charged to the timed call (a large share of a 4096x1024 fp32 call's
64 MB), and when the host is slower than the GPU it times the host. ``host_us`` reports that
host time separately. On CPU (the Triton interpreter) a wall clock stands in: code paths only.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F

__all__ = [
    "LIGER",
    "SHAPES",
    "liger_rms_norm",
    "loop_us",
    "RMSNormBandwidth",
    "copy_tbps",
    "eager_rms_norm",
    "events_ms",
    "host_us",
    "measure_rmsnorm",
    "rmsnorm_inputs",
    "step_fn",
    "tbps",
    "torch_rms_norm",
]

# The benchmarked shapes (rows, d): hidden sizes 1024..8192 at 4096 rows, and GPT-2 XL's 1600 at 16384.
SHAPES = [(4096, 1024), (4096, 2048), (4096, 4096), (4096, 8192), (16384, 1600)]
EPS = 1e-5
LIGER = "Liger-Kernel"  # the variant name of ``liger_rms_norm``


def eager_rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def torch_rms_norm(x, weight, eps):
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def triton_rms_norm(x, weight, eps):
    from paracheck.kernels import rms_norm

    return rms_norm(x, weight, eps)


def liger_rms_norm():
    """Liger-Kernel's RMSNorm function with its module's defaults (``in_place=True``: dy's
    storage receives dx), or None where liger_kernel is not installed."""
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except ImportError:
        return None

    def fn(x, weight, eps):
        return LigerRMSNormFunction.apply(x, weight, eps)

    return fn


def loop_us(fn, *, grad_to_none=(), n=30, rounds=5, device="cuda") -> float:
    """Back-to-back wall time per call: ``n`` calls queued with nothing between them, then a
    synchronisation; the median over ``rounds``. What a model feels when the host is the
    slower side."""
    if torch.device(device).type != "cuda":
        return wall_ms(fn, grad_to_none=grad_to_none) * 1e3
    fn()
    torch.cuda.synchronize(device)
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            for t in grad_to_none:
                t.grad = None
            fn()
        torch.cuda.synchronize(device)
        out.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(out)


# ------------------------------------------------------------------------------------------
# Timers (Note [timing]).

_FLUSH: dict[str, torch.Tensor] = {}


def events_ms(fn, *, grad_to_none=(), reps=40, sleep_cycles=None, device="cuda") -> float:
    """Median GPU time of ``fn`` with a cold, clean L2 and the call queued ahead.

    The GPU is held for ``sleep_cycles`` clock cycles before each call; by default three times
    the host time of one call (at least 10^6 cycles, ~0.5 ms): a hold shorter than the host's
    queueing would time the host's gaps as GPU time."""
    if torch.device(device).type != "cuda":
        return wall_ms(fn, grad_to_none=grad_to_none)
    flush = _FLUSH.get(device)
    if flush is None:
        flush = _FLUSH[device] = torch.ones(2**26, device=device)  # 256 MiB
    fn()
    torch.cuda.synchronize(device)
    if sleep_cycles is None:
        host_s = host_us(fn, grad_to_none=grad_to_none, n=5, device=device) * 1e-6
        # cycles of the SM clock; 2 GHz (an H100's or H200's boost clock) where torch does not say
        khz = getattr(torch.cuda.get_device_properties(device), "clock_rate", 0) or 2_000_000
        clock_hz = khz * 1e3
        sleep_cycles = max(1_000_000, int(3 * host_s * clock_hz))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        for t in grad_to_none:
            t.grad = None
        flush.sum()  # reads 256 MiB: evicts everything, leaves nothing dirty
        torch.cuda._sleep(sleep_cycles)  # the host queues fn's launches meanwhile
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize(device)
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def do_bench_ms(fn, *, grad_to_none=(), device="cuda") -> float:
    if torch.device(device).type != "cuda":
        return wall_ms(fn, grad_to_none=grad_to_none)
    from triton.testing import do_bench

    return do_bench(fn, grad_to_none=list(grad_to_none) or None, return_mode="median")


def wall_ms(fn, *, grad_to_none=()) -> float:
    for t in grad_to_none:
        t.grad = None
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def host_us(fn, *, grad_to_none=(), n=20, device="cuda") -> float:
    """Host time per call, the GPU left to run behind (no synchronisation inside the loop)."""
    cuda = torch.device(device).type == "cuda"
    fn()
    if cuda:
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(n):
        for t in grad_to_none:
            t.grad = None
        fn()
    t1 = time.perf_counter()
    if cuda:
        torch.cuda.synchronize(device)
    return (t1 - t0) / n * 1e6


def tbps(nbytes, ms) -> float:
    return nbytes / (ms * 1e-3) / 1e12


def copy_tbps(n, *, device="cuda", timer=events_ms) -> float:
    """Device-to-device copy bandwidth of ``n`` float32 values (bytes read + written)."""
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    return tbps(2 * n * 4, timer(lambda: dst.copy_(src), device=device))


# ------------------------------------------------------------------------------------------
# Inputs, correctness, one fwd+bwd step.


def rmsnorm_inputs(rows, d, *, seed=0, device="cuda", dtype=torch.float32):
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(rows, d, device=device, generator=g).to(dtype)
    w = (1.0 + 0.1 * torch.randn(d, device=device, generator=g)).to(dtype)
    dy = torch.randn(rows, d, device=device, generator=g).to(dtype)
    return x, w, dy


def check_against_oracle(name, fn, x, w, dy) -> list[float]:
    """Relative (Frobenius) errors of y, dx, dweight against the float64 oracle; raises."""
    from paracheck.oracle.rmsnorm import rms_norm_reference, rms_norm_reference_grads

    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = fn(xg, wg, EPS)
    y.backward(dy.clone())  # a copy: some variants write dx into dy's storage
    x64, w64, dy64 = x.double(), w.double(), dy.double()
    refs = (rms_norm_reference(x64, w64, EPS), *rms_norm_reference_grads(x64, w64, dy64, EPS))
    errs = [
        ((a.double() - r).norm() / r.norm()).item() for a, r in zip((y, xg.grad, wg.grad), refs)
    ]
    # float32 arithmetic with sums of length <= 16384: norm-wise errors are ~1e-7; 1e-5 is a
    # failure, not noise. Stored in bf16/fp16 (float32 arithmetic), each output element is
    # rounded once to the storage dtype: norm-wise <= its unit roundoff u; 4u is a failure.
    bound = {torch.bfloat16: 4 * 2.0**-8, torch.float16: 4 * 2.0**-11}.get(x.dtype, 1e-5)
    if not all(e <= bound for e in errs):
        raise AssertionError(f"{name}: relative errors y/dx/dw = {errs}")
    return errs


def step_fn(fn, x, w, dy):
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()

    def step():
        fn(xg, wg, EPS).backward(dy)

    return step, (xg, wg)


# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RMSNormBandwidth:
    """One shape: effective TB/s of each variant (NaN where it failed) and the copy ceiling."""

    rows: int
    d: int
    tbps: dict  # variant name -> TB/s
    copy_tbps: float
    dtype: str = "float32"
    # variant name -> back-to-back wall time per call, us (``loop_us``); empty where not measured
    loop_us: dict = field(default_factory=dict)

    def ratio(self, variant: str, peer: str = "F.rms_norm") -> float:
        return self.tbps[variant] / self.tbps[peer]

    def loop_ratio(self, variant: str, peer: str = "F.rms_norm") -> float:
        """How many times faster ``variant`` runs back to back than ``peer`` (NaN where either
        was not measured)."""
        a, b = self.loop_us.get(variant), self.loop_us.get(peer)
        return float("nan") if a is None or b is None else b / a

    def fraction_of_copy(self, variant: str = "triton") -> float:
        return self.tbps[variant] / self.copy_tbps

    def to_dict(self) -> dict:
        d = asdict(self)
        d["triton_vs_torch"] = self.ratio("triton")
        d["triton_fraction_of_copy"] = self.fraction_of_copy()
        if LIGER in self.tbps:
            d["triton_vs_liger"] = self.ratio("triton", LIGER)
        if self.loop_us:
            d["triton_vs_torch_loop"] = self.loop_ratio("triton")
            d["triton_vs_liger_loop"] = self.loop_ratio("triton", LIGER)
        return d


def measure_rmsnorm(
    *,
    device="cuda",
    shapes=SHAPES,
    compile=True,
    reps=40,
    copy_elements=2**29,
    dtype=torch.float32,
    loop=False,
    liger=False,
) -> list[RMSNormBandwidth]:
    """Effective fwd+bwd bandwidth of paracheck's kernel, ``F.rms_norm``, the eager formula,
    (``compile``) ``torch.compile`` of it and (``liger``, where liger_kernel is installed)
    Liger-Kernel's, per shape, in ``dtype``, with the copy ceiling of this run;
    with ``loop``, also each one's back-to-back time per call (``loop_us``)."""
    copy = copy_tbps(copy_elements, device=device)
    out = []
    for rows, d in shapes:
        x, w, dy = rmsnorm_inputs(rows, d, device=device, dtype=dtype)
        variants = {
            "triton": triton_rms_norm,
            "F.rms_norm": torch_rms_norm,
            "eager": eager_rms_norm,
        }
        if compile:
            torch._dynamo.reset()
            variants["torch.compile"] = torch.compile(eager_rms_norm, dynamic=False)
        liger_fn = liger_rms_norm() if liger else None
        if liger_fn is not None:
            variants[LIGER] = liger_fn
        got, loops = {}, {}
        for name, fn in variants.items():
            try:
                check_against_oracle(name, fn, x, w, dy)
                step, grads = step_fn(fn, x, w, dy)
                got[name] = tbps(
                    4 * rows * d * x.element_size(),
                    events_ms(step, grad_to_none=grads, reps=reps, device=device),
                )
                if loop:
                    loops[name] = loop_us(step, grad_to_none=grads, device=device)
            except Exception:
                if name in ("triton", "F.rms_norm"):
                    raise  # the kernel under test and its peer must both be measured
                got[name] = float("nan")  # a peer that fails here (e.g. no compiler) is shown so
        name = str(dtype).removeprefix("torch.")
        out.append(RMSNormBandwidth(rows, d, got, copy, dtype=name, loop_us=loops))
    return out
