"""RMSNorm experiments on one GPU: where host time goes, and backward variants.

Not a benchmark of record (that is ``bench_rmsnorm.py``); this times candidate changes side by
side in one call so the device lease is spent once:

* ``host``: host microseconds per launch of the forward kernel, per autograd forward, and of a
  torch elementwise kernel and ``torch.empty`` for scale.
* ``bwd``: forward+backward sequences (launchers called directly, no autograd), effective TB/s
  with 4 * rows * d * 4 bytes counted, L2 flushed by a read and the host queued ahead, for the
  library's backward with several programs-per-SM / warps, with the separate dweight kernel,
  and for a variant whose loop is pipelined by triton (``tl.range(num_stages=...)``) instead of
  by hand.

    PYTHONPATH=src python experiments/rmsnorm_experiments.py [--what host,bwd,ab,pdl,reverse,atomics]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

import torch

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")
)
from bench_rmsnorm import EPS, SHAPES, events_ms, inputs, tbps  # noqa: E402

from paracheck.kernels import rmsnorm as K  # noqa: E402
from paracheck.kernels.rmsnorm import lazy_jit, tl, triton  # noqa: E402


@lazy_jit
def _bwd_staged_kernel(
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
    STAGES: tl.constexpr,
):
    # The library's backward without the hand-written prefetch: triton pipelines the loop.
    pid = tl.program_id(0)
    step = tl.num_programs(0) * ROWS
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < n_cols
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
    for start in tl.range(pid * ROWS, n_rows, step, num_stages=STAGES):
        rows = start + tl.arange(0, ROWS)
        row_ok = rows < n_rows
        ok = row_ok[:, None] & col_ok[None, :]
        rows64 = rows.to(tl.int64)
        xf = tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=ok, other=0.0).to(
            tl.float32
        )
        dyf = tl.load(DY + rows64[:, None] * stride_dy + cols[None, :], mask=ok, other=0.0).to(
            tl.float32
        )
        rstd = tl.load(RSTD + rows, mask=row_ok, other=0.0)
        xhat = xf * rstd[:, None]
        wdy = dyf * w[None, :]
        c = tl.sum(xhat * wdy, axis=1) / n_cols
        dx = (wdy - xhat * c[:, None]) * rstd[:, None]
        tl.store(
            DX + rows64[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=ok
        )
        dw_acc += dyf * xhat
    tl.store(DW_PARTIAL + pid * n_cols + cols, tl.sum(dw_acc, axis=0), mask=col_ok)


def staged_backward(dy, x, w, rstd, plan, stages):
    n_rows, n_cols = x.shape
    dx = torch.empty_like(x)
    partial = torch.empty((plan.bwd_programs, n_cols), dtype=torch.float32, device=x.device)
    dw = torch.empty_like(w)
    _bwd_staged_kernel[(plan.bwd_programs,)](
        x,
        w,
        dy,
        rstd,
        dx,
        partial,
        x.stride(0),
        dy.stride(0),
        dx.stride(0),
        n_rows,
        n_cols,
        BLOCK_D=plan.block_d,
        ROWS=plan.bwd_rows,
        STAGES=stages,
        num_warps=plan.bwd_warps,
    )
    K.KERNELS.reduce_dweight[(triton.cdiv(n_cols, 64),)](
        partial, dw, plan.bwd_programs, n_cols, BLOCK_P=64, BLOCK_N=64, PDL=False, num_warps=4
    )
    return dx, dw


def host_us(fn, n=2000) -> float:
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def host(lines):
    rows, d = 64, 1024  # tiny: the GPU keeps up, so only host time is measured
    x, w, dy = inputs(rows, d)
    y = torch.empty_like(x)
    rstd = torch.empty(rows, device="cuda")
    p = K.launch_plan(rows, d, interpreted=False, n_sms=K.sm_count(x.device))
    grid = (triton.cdiv(rows, p.fwd_rows),)
    args = (x, w, y, rstd, x.stride(0), y.stride(0), rows, d, EPS)
    pdl = K._dependent_launch(x.device)
    kw = dict(
        BLOCK_D=p.block_d,
        ROWS=p.fwd_rows,
        X_EVICT=p.x_evict,
        Y_EVICT=p.y_evict,
        PDL=pdl,
        **K._pdl_option(pdl),
    )
    fwd = K.KERNELS.forward
    cases = {
        "torch.empty(64x1024)": lambda: torch.empty((rows, d), device="cuda"),
        "torch y.mul_(1.0) (one aten kernel)": lambda: y.mul_(1.0),
        "one triton launch (fwd[grid](...))": lambda: fwd[grid](*args, **kw, num_warps=p.fwd_warps),
        "paracheck _rms_norm_forward (allocations + launch)": lambda: K._rms_norm_forward(
            x, w, EPS, K.KERNELS
        ),
        "paracheck rms_norm forward (autograd.Function, no grad)": lambda: K.rms_norm(x, w, EPS),
        "F.rms_norm forward (no grad)": lambda: torch.nn.functional.rms_norm(x, (d,), w, EPS),
    }
    lines += [
        "## Host time per call, us (64x1024 fp32, 2000 calls, no sync inside)",
        "",
        "| what | us |",
        "| --- | --- |",
    ]
    for name, fn in cases.items():
        lines.append(f"| {name} | {host_us(fn):.1f} |")
        print(lines[-1], flush=True)


def seq_tbps(rows, d, fwd_plan, bwd):
    x, w, dy = inputs(rows, d)
    # Correct first: the variant's dx and dweight against the library's default on fresh inputs.
    xc, wc, dyc = inputs(rows, d, seed=1)
    _, rstd = K._rms_norm_forward(xc, wc, EPS, K.KERNELS)
    ref = K._rms_norm_backward(dyc, xc, wc, rstd, K.KERNELS)
    got = bwd(dyc, xc, wc, rstd)
    for a, b in zip(got, ref):
        err = ((a - b).norm() / b.norm()).item()
        if not err < 1e-5:
            raise AssertionError(f"variant differs from the library: relative error {err:.2e}")

    def step():
        _, rstd = K._rms_norm_forward(x, w, EPS, K.KERNELS, fwd_plan)
        bwd(dy, x, w, rstd)

    return tbps(4 * rows * d * 4, events_ms(step, reps=25))


def bwd(lines):
    lines += ["", "## fwd+bwd sequences, TB/s (launchers only, no autograd)", ""]
    for rows, d in SHAPES:
        n_sms = K.sm_count(torch.device("cuda"))
        base = K.launch_plan(rows, d, interpreted=False, n_sms=n_sms)
        hints = dict(x_evict=base.x_evict, y_evict=base.y_evict, bwd_load_evict=base.bwd_load_evict)
        results = []

        def lib(plan):
            return lambda dy, x, w, rstd: K._rms_norm_backward(dy, x, w, rstd, K.KERNELS, plan)

        results.append(("library default", seq_tbps(rows, d, base, lib(base))))
        for per_sm in (1, 2, 3, 4):
            for warps in (4, 8, 16):
                if warps * 32 * 4 > base.bwd_rows * base.block_d:  # < 4 values per thread
                    continue
                plan = K.gpu_plan(
                    rows,
                    d,
                    n_sms=n_sms,
                    fwd_rows=base.fwd_rows,
                    fwd_warps=base.fwd_warps,
                    bwd_rows=base.bwd_rows,
                    bwd_warps=warps,
                    bwd_per_sm=per_sm,
                    **hints,
                )
                try:
                    results.append(
                        (
                            f"hand-pipelined, {per_sm}/SM, {warps} warps",
                            seq_tbps(rows, d, base, lib(plan)),
                        )
                    )
                except Exception as e:
                    results.append(
                        (f"hand-pipelined, {per_sm}/SM, {warps} warps: {type(e).__name__}", 0.0)
                    )
                for stages in (2, 3):
                    try:
                        results.append(
                            (
                                f"triton-pipelined ({stages} stages), {per_sm}/SM, {warps} warps",
                                seq_tbps(
                                    rows,
                                    d,
                                    base,
                                    lambda dy, x, w, rstd, plan=plan, st=stages: staged_backward(
                                        dy, x, w, rstd, plan, st
                                    ),
                                ),
                            )
                        )
                    except Exception as e:
                        results.append(
                            (
                                f"triton-pipelined ({stages}), {per_sm}/SM, {warps}: "
                                f"{type(e).__name__}",
                                0.0,
                            )
                        )
        lines += [
            f"### {rows}x{d} (default: {base.bwd_programs} programs, {base.bwd_warps} warps)",
            "",
            "| variant | TB/s |",
            "| --- | --- |",
        ]
        ranked = results[:1] + sorted(results[1:], key=lambda r: -r[1])[:8]
        lines += [f"| {name} | {v:.2f} |" for name, v in ranked]
        print("\n".join(lines[-len(ranked) - 4 :]), flush=True)


def interleaved_plans(lines, rows, d, fwd_plan, plans, rounds):
    """fwd+bwd sequences with each backward plan of ``plans``, the plans taking turns for
    ``rounds`` rounds; one table row per plan (median, min-max TB/s)."""
    import statistics

    got = {name: [] for name in plans}
    for _ in range(rounds):
        for name, plan in plans.items():
            got[name].append(
                seq_tbps(
                    rows,
                    d,
                    fwd_plan,
                    lambda dy, x, w, rstd, plan=plan: K._rms_norm_backward(
                        dy, x, w, rstd, K.KERNELS, plan
                    ),
                )
            )
    for name, v in got.items():
        lines.append(
            f"| {rows}x{d} | {name} | {statistics.median(v):.3f} | {min(v):.3f}-{max(v):.3f} |"
        )
        print(lines[-1], flush=True)


def ab(lines, rounds=7):
    """The default backward plan against candidates, interleaved ``rounds`` times (medians)."""
    n_sms = K.sm_count(torch.device("cuda"))
    lines += [
        "",
        f"## A/B of backward plans, fwd+bwd TB/s, median of {rounds} interleaved rounds",
        "",
        "| shape | plan | TB/s (median) | min-max |",
        "| --- | --- | --- | --- |",
    ]
    # (rows per tile, warps, programs per SM) candidates: bigger tiles or more programs put
    # more bytes in flight per SM.
    candidates = {
        (4096, 2048): [(4, 16, 1), (4, 8, 2), (2, 4, 3), (2, 8, 3), (1, 4, 4)],
        (16384, 1600): [(4, 16, 1), (4, 8, 2)],
        (4096, 1024): [(8, 8, 2), (4, 4, 3), (4, 8, 3)],
    }
    for rows, d in candidates:
        base = K.launch_plan(rows, d, interpreted=False, n_sms=n_sms)
        hints = dict(x_evict=base.x_evict, y_evict=base.y_evict, bwd_load_evict=base.bwd_load_evict)
        plans = {
            f"default (rows {base.bwd_rows}, {base.bwd_programs} programs, "
            f"{base.bwd_warps} warps)": base
        }
        for r, warps, per_sm in candidates[rows, d]:
            plans[f"rows {r}, {warps} warps, {per_sm}/SM"] = K.gpu_plan(
                rows,
                d,
                n_sms=n_sms,
                fwd_rows=base.fwd_rows,
                fwd_warps=base.fwd_warps,
                bwd_rows=r,
                bwd_warps=warps,
                bwd_per_sm=per_sm,
                **hints,
            )
        interleaved_plans(lines, rows, d, base, plans, rounds)


def pdl(lines, rounds=7):
    """Autograd fwd+bwd with and without dependent launch, interleaved ``rounds`` times."""
    import statistics

    from bench_rmsnorm import step_fn, torch_rms_norm, triton_variant

    lines += [
        "",
        f"## Dependent launch on/off, autograd fwd+bwd TB/s, median of {rounds} "
        "interleaved rounds (F.rms_norm alongside)",
        "",
        "| shape | variant | TB/s (median) | min-max |",
        "| --- | --- | --- | --- |",
    ]
    for rows, d in SHAPES:
        x, w, dy = inputs(rows, d)
        variants = {
            "PDL on (default)": triton_variant(),
            "PDL off": triton_variant(dependent_launch=False),
            "F.rms_norm": torch_rms_norm,
        }
        got = {name: [] for name in variants}
        for _ in range(rounds):
            for name, fn in variants.items():
                step, grads = step_fn(fn, x, w, dy)
                got[name].append(
                    tbps(4 * rows * d * 4, events_ms(step, grad_to_none=grads, reps=25))
                )
        for name, v in got.items():
            lines.append(
                f"| {rows}x{d} | {name} | {statistics.median(v):.3f} | {min(v):.3f}-{max(v):.3f} |"
            )
            print(lines[-1], flush=True)


def reverse(lines, rounds=7):
    """The backward walking rows last-to-first (Note [reverse walk]) against the default, in
    fwd+bwd sequences, interleaved ``rounds`` times (medians)."""
    n_sms = K.sm_count(torch.device("cuda"))
    lines += [
        "",
        f"## Backward row order, fwd+bwd TB/s, median of {rounds} interleaved rounds",
        "",
        "| shape | order | TB/s (median) | min-max |",
        "| --- | --- | --- | --- |",
    ]
    for rows, d in SHAPES:
        base = K.launch_plan(rows, d, interpreted=False, n_sms=n_sms)
        order = {False: "first to last", True: "last to first"}
        plans = {
            f"{order[base.bwd_reverse]} (the plan's)": base,
            order[not base.bwd_reverse]: dataclasses.replace(
                base, bwd_reverse=not base.bwd_reverse
            ),
        }
        interleaved_plans(lines, rows, d, base, plans, rounds)


def _atomic_kernels():
    """The production forward and backward, edited (``_mutated``) so that the forward's first
    program zeroes a float32 dweight and each backward program adds its partial to it with
    float32 atomics: no second kernel, but a summation order that varies from run to run."""
    from paracheck.mutants.rmsnorm import _mutated

    fwd = _mutated(
        K.KERNELS.forward,
        "_fwd_zeroing_dweight",
        (
            "    X, W, Y, RSTD, stride_x, stride_y, n_rows, n_cols, eps,\n",
            "    X, W, Y, RSTD, DWZ, stride_x, stride_y, n_rows, n_cols, eps,\n",
        ),
        (
            "    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / n_cols + eps)\n",
            "    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / n_cols + eps)\n"
            "    tl.store(DWZ + cols, tl.zeros([BLOCK_D], dtype=tl.float32),\n"
            "             mask=cols + BLOCK_D * tl.program_id(0) < n_cols)\n",
        ),
    )
    bwd = _mutated(
        K.KERNELS.backward,
        "_bwd_atomic_dweight",
        (
            "    tl.store(DW_PARTIAL + pid * n_cols + cols, tl.sum(dw_acc, axis=0), mask=col_ok)\n",
            '    tl.atomic_add(DW_PARTIAL + cols, tl.sum(dw_acc, axis=0), mask=col_ok, sem="relaxed")\n',
        ),
    )
    return fwd, bwd


def atomics(lines, rounds=7):
    """Separate dweight kernel (the library) against float32 atomics in the backward, in
    fwd+bwd sequences, interleaved ``rounds`` times (medians): what a non-deterministic
    dweight would buy."""
    import statistics

    fwd_k, bwd_k = _atomic_kernels()
    n_sms = K.sm_count(torch.device("cuda"))
    lines += [
        "",
        f"## dweight by float32 atomics, fwd+bwd TB/s, median of {rounds} interleaved rounds",
        "",
        "| shape | dweight | TB/s (median) | min-max |",
        "| --- | --- | --- | --- |",
    ]
    for rows, d in SHAPES:
        p = K.launch_plan(rows, d, interpreted=False, n_sms=n_sms)
        x, w, dy = inputs(rows, d)

        def atomic_step(x=x, w=w, dy=dy, p=p):
            y = torch.empty_like(x)
            rstd = torch.empty(rows, device=x.device)
            dw = torch.empty(d, device=x.device)
            dx = torch.empty_like(x)
            opt = K._pdl_option(True)
            fwd_k[(-(-rows // p.fwd_rows),)](
                x,
                w,
                y,
                rstd,
                dw,
                x.stride(0),
                y.stride(0),
                rows,
                d,
                EPS,
                BLOCK_D=p.block_d,
                ROWS=p.fwd_rows,
                X_EVICT=p.x_evict,
                Y_EVICT=p.y_evict,
                PDL=True,
                num_warps=p.fwd_warps,
                **opt,
            )
            bwd_k[(p.bwd_programs,)](
                x,
                w,
                dy,
                rstd,
                dx,
                dw,
                x.stride(0),
                dy.stride(0),
                dx.stride(0),
                rows,
                d,
                BLOCK_D=p.block_d,
                ROWS=p.bwd_rows,
                LOAD_EVICT=p.bwd_load_evict,
                PDL=True,
                REVERSE=p.bwd_reverse,
                num_warps=p.bwd_warps,
                **opt,
            )
            return y, dx, dw

        y, dx, dw = atomic_step()
        _, rstd = K._rms_norm_forward(x, w, EPS, K.KERNELS)
        ref = K._rms_norm_backward(dy, x, w, rstd, K.KERNELS)
        for a, b in zip((dx, dw), ref):
            err = ((a - b).norm() / b.norm()).item()
            if not err < 1e-5:
                raise AssertionError(f"atomics at {rows}x{d}: relative error {err:.2e}")
        got = {"separate kernel (library)": [], "float32 atomics": []}
        for _ in range(rounds):
            got["separate kernel (library)"].append(
                seq_tbps(
                    rows,
                    d,
                    p,
                    lambda dy, x, w, rstd: K._rms_norm_backward(dy, x, w, rstd, K.KERNELS),
                )
            )
            got["float32 atomics"].append(tbps(4 * rows * d * 4, events_ms(atomic_step, reps=25)))
        for name, v in got.items():
            lines.append(
                f"| {rows}x{d} | {name} | {statistics.median(v):.3f} | {min(v):.3f}-{max(v):.3f} |"
            )
            print(lines[-1], flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--what", default="host,bwd")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device (skipped)")
        return 0
    lines = [
        f"{torch.cuda.get_device_name()}; torch {torch.__version__}, triton {triton.__version__}"
    ]
    what = args.what.split(",")
    if "host" in what:
        host(lines)
    if "bwd" in what:
        bwd(lines)
    if "ab" in what:
        ab(lines)
    if "pdl" in what:
        pdl(lines)
    if "reverse" in what:
        reverse(lines)
    if "atomics" in what:
        atomics(lines)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "rmsnorm_experiments.md"), "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
