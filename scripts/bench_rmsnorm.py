"""RMSNorm forward+backward effective bandwidth on one GPU, float32.

Variants: paracheck's Triton kernel, ``F.rms_norm``, the eager formula and ``torch.compile`` of
the eager formula. Effective bandwidth counts x, y, dy and dx once each (4 * rows * d * 4 bytes)
over the median time of one forward+backward (``triton.testing.do_bench``: L2 flushed before
every call, gradients reset to None so no accumulation kernel runs). Each variant is first
checked against the float64 oracle on the same inputs. Device copy bandwidth (a 2 GiB
device-to-device copy, bytes read + written) is measured in the same run as the ceiling.

    PYTHONPATH=src python scripts/bench_rmsnorm.py            # table (written to $OUT too)
    PYTHONPATH=src python scripts/bench_rmsnorm.py --sweep    # also time launch plans
    TRITON_INTERPRET=1 PYTHONPATH=src python scripts/bench_rmsnorm.py --smoke  # CPU: code paths only
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import torch
import torch.nn.functional as F

SHAPES = [(4096, 1024), (4096, 2048), (4096, 4096), (4096, 8192), (16384, 1600)]
EPS = 1e-5
DEVICE = "cuda"


def eager_rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def torch_rms_norm(x, weight, eps):
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def copy_tbps(do_bench, n=2**29) -> float:
    """Device-to-device copy bandwidth, bytes read + written (default 2 GiB of float32)."""
    src = torch.randn(n, device=DEVICE)
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), return_mode="median")
    del src, dst
    return 2 * n * 4 / (ms * 1e-3) / 1e12


def inputs(rows, d, seed=0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    x = torch.randn(rows, d, device=DEVICE, generator=g)
    w = 1.0 + 0.1 * torch.randn(d, device=DEVICE, generator=g)
    dy = torch.randn(rows, d, device=DEVICE, generator=g)
    return x, w, dy


def check(fn, x, w, dy):
    """Relative (Frobenius) errors of y, dx, dweight against the float64 oracle; raises."""
    from paracheck.oracle.rmsnorm import rms_norm_reference, rms_norm_reference_grads

    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = fn(xg, wg, EPS)
    y.backward(dy)
    x64, w64, dy64 = x.double(), w.double(), dy.double()
    refs = (rms_norm_reference(x64, w64, EPS), *rms_norm_reference_grads(x64, w64, dy64, EPS))
    errs = [((a.double() - r).norm() / r.norm()).item() for a, r in zip((y, xg.grad, wg.grad), refs)]
    # float32 arithmetic with sums of length <= 16384: norm-wise errors are ~1e-7; 1e-5 is a
    # failure, not noise.
    if not all(e <= 1e-5 for e in errs):
        raise AssertionError(f"{getattr(fn, '__name__', fn)}: relative errors y/dx/dw = {errs}")
    return errs


def time_fwd_bwd(do_bench, fn, x, w, dy) -> float:
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()

    def step():
        fn(xg, wg, EPS).backward(dy)

    return do_bench(step, grad_to_none=[xg, wg], return_mode="median")


def sweep(do_bench, rows, d, lines):
    """Time forward and backward launch plans separately (bandwidth of what each moves)."""
    import triton

    from paracheck.kernels import rmsnorm as K

    x, w, dy = inputs(rows, d)
    n_sms = K._sm_count(x.device)
    base = K._plan(rows, d, interpreted=False, n_sms=n_sms)
    block_d = base.block_d
    lines.append(f"\n### {rows}x{d} (default plan {base})\n")
    lines.append("| pass | rows/tile | warps | programs/SM | TB/s |")
    lines.append("| --- | --- | --- | --- | --- |")
    results = []

    def timed(key, fn, nbytes):
        try:
            ms = do_bench(fn, warmup=5, rep=25, return_mode="median")
            results.append((*key, nbytes / (ms * 1e-3) / 1e12))
        except Exception as e:  # a plan that does not compile or launch: report, go on
            lines.append(f"<!-- {key}: {type(e).__name__}: {str(e)[:120]} -->")

    def shapes(max_per_thread):
        for r in (1, 2, 4, 8, 16):
            for warps in (4, 8, 16, 32):
                if 4 <= r * block_d // (32 * warps) <= max_per_thread and r <= rows:
                    yield r, warps

    for r, warps in shapes(64):
        plan = dataclasses.replace(base, fwd_rows=r, fwd_warps=warps)
        timed(("fwd", r, warps, "-"), lambda: K._rms_norm_forward(x, w, EPS, K._KERNELS, plan),
              2 * rows * d * 4)
    _, rstd = K._rms_norm_forward(x, w, EPS, K._KERNELS)
    for r, warps in shapes(32):
        for per_sm in (1, 2, 4):
            plan = K._gpu_plan(rows, d, n_sms=n_sms, fwd_rows=base.fwd_rows,
                               fwd_warps=base.fwd_warps, bwd_rows=r, bwd_warps=warps,
                               bwd_per_sm=per_sm)
            timed(("bwd", r, warps, per_sm),
                  lambda: K._rms_norm_backward(dy, x, w, rstd, K._KERNELS, plan),
                  3 * rows * d * 4)
    # Where the default plan's fwd+bwd time goes: launchers without autograd, and each part.
    p = base
    partial = torch.empty(p.bwd_programs, d, device=x.device)
    dw = torch.empty_like(w)
    parts = {
        "fwd+bwd launchers, no autograd": lambda: K._rms_norm_backward(
            dy, x, w, K._rms_norm_forward(x, w, EPS, K._KERNELS)[1], K._KERNELS),
        "fwd": lambda: K._rms_norm_forward(x, w, EPS, K._KERNELS),
        "bwd (2 kernels)": lambda: K._rms_norm_backward(dy, x, w, rstd, K._KERNELS),
        "dweight reduction alone": lambda: K._KERNELS.reduce_dweight[
            (triton.cdiv(d, p.red_block_n),)](partial, dw, p.bwd_programs, d,
                                              BLOCK_P=p.red_block_p, BLOCK_N=p.red_block_n),
    }
    for name, fn in parts.items():
        ms = do_bench(fn, warmup=5, rep=25, return_mode="median")
        lines.append(f"<!-- default plan, {name}: {ms * 1e3:.1f} us -->")
    for pass_ in ("fwd", "bwd"):
        best = sorted((t for t in results if t[0] == pass_), key=lambda t: -t[-1])
        for t in best[:8]:
            lines.append(f"| {t[0]} | {t[1]} | {t[2]} | {t[3]} | {t[4]:.2f} |")
    print("\n".join(lines[-22:]), flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="also time launch plans")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--smoke", action="store_true",
                        help="CPU under TRITON_INTERPRET=1, tiny shapes, wall-clock timer: "
                             "checks the code paths, measures nothing")
    args = parser.parse_args(argv)
    global DEVICE, SHAPES
    if args.smoke:
        import time

        DEVICE, SHAPES = "cpu", [(64, 100), (8, 1024)]

        def do_bench(fn, grad_to_none=None, **_):
            for t in grad_to_none or ():
                t.grad = None
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
    elif not torch.cuda.is_available():
        print("no CUDA device: nothing to benchmark (skipped)")
        return 0
    else:
        from triton.testing import do_bench
    import triton

    from paracheck.kernels import rms_norm

    out_dir = os.environ.get("OUT")
    device_name = (f"{torch.cuda.get_device_properties(0).name}, "
                   f"{torch.cuda.get_device_properties(0).multi_processor_count} SMs"
                   if DEVICE == "cuda" else "CPU (Triton interpreter, smoke run)")
    header = (f"{device_name}; torch {torch.__version__}, "
              f"triton {triton.__version__}; fp32, eps={EPS}; median of do_bench (L2 flushed)")
    copy = copy_tbps(do_bench, n=2**29 if DEVICE == "cuda" else 2**20)
    lines = [f"RMSNorm forward+backward effective bandwidth (x, y, dy, dx counted once), TB/s. "
             f"{header}. Device copy: {copy:.2f} TB/s.", "",
             "| shape | triton | F.rms_norm | eager | torch.compile | triton / F.rms_norm "
             "| triton / copy |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    print("\n".join(lines), flush=True)

    def write(name, text):
        if out_dir:
            with open(os.path.join(out_dir, name), "w") as f:
                f.write(text + "\n")

    for rows, d in SHAPES:
        x, w, dy = inputs(rows, d)
        variants = {"triton": rms_norm, "F.rms_norm": torch_rms_norm, "eager": eager_rms_norm}
        if not (args.no_compile or args.smoke):
            torch._dynamo.reset()
            variants["torch.compile"] = torch.compile(eager_rms_norm, dynamic=False)
        tbps = {}
        for name, fn in variants.items():
            check(fn, x, w, dy)
            ms = time_fwd_bwd(do_bench, fn, x, w, dy)
            tbps[name] = 4 * rows * d * 4 / (ms * 1e-3) / 1e12
        row = (f"| {rows}x{d} | {tbps['triton']:.2f} | {tbps['F.rms_norm']:.2f} | "
               f"{tbps['eager']:.2f} | {tbps.get('torch.compile', float('nan')):.2f} | "
               f"{tbps['triton'] / tbps['F.rms_norm']:.2f}x | {100 * tbps['triton'] / copy:.0f}% |")
        lines.append(row)
        print(row, flush=True)
        write("rmsnorm_bench.md", "\n".join(lines))
    if args.sweep:
        sweep_lines = ["## Launch-plan sweep (each pass alone; fwd moves x+y, bwd x+dy+dx)"]
        for rows, d in SHAPES:
            sweep(do_bench, rows, d, sweep_lines)
            write("rmsnorm_sweep.md", "\n".join(sweep_lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
