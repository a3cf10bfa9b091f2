"""RMSNorm where it is used: host time per call and the LM's step, each norm in the same run.

Not a benchmark of record (``scripts/bench_rmsnorm.py --model`` is); this times the pieces of a
call and their alternatives side by side so one device lease answers where the host time goes:

* ``host``: host microseconds per forward+backward (20 calls queued back to back, the GPU left
  to run behind, median of 7 rounds) at the LM's shapes, for ``F.rms_norm``, paracheck's
  prepared path, its checked path (triton's own launch), Liger-Kernel where installed, and the
  pieces: ``torch.empty``, an empty ``autograd.Function``, one direct launch.
* ``lm``, ``graph``, ``compile``: the LM's whole step with each norm and none
  (``paracheck.bench.lm.time_lm_steps``): eager, replayed from one CUDA graph, or compiled.
* ``plans``: fwd+bwd GPU time of launch-plan alternatives per shape, bf16 and fp32.
* ``boundary``: where the LM's eager step loses with ``norm="triton"``: how many of its norm
  calls took the prepared host path (forward and backward; Note [host path]), and the step with
  a fourth norm, ``boundary``: ``F.rms_norm``'s forward inside a Python ``autograd.Function``
  whose backward does no work (its gradients are wrong; only its time counts): the cost of the
  Function boundary alone, against the torch norm, the Triton norm and none.

    PYTHONPATH=src python experiments/rmsnorm_in_model.py [--what host,lm,graph,compile,plans,boundary]
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch
import torch.nn.functional as F

from paracheck.bench import rmsnorm as B
from paracheck.kernels import rmsnorm as K

EPS = 1e-5


def host_us(fn, *, n=20, rounds=7) -> float:
    """Median over rounds of ``paracheck.bench.rmsnorm.host_us`` (calls queued, no sync)."""
    return statistics.median(B.host_us(fn, n=n) for _ in range(rounds))


class _Empty(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, dy):
        return dy, None


def host_table(rows, d, dtype) -> list[str]:
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(rows, d, device="cuda", generator=g).to(dtype).requires_grad_()
    w = (1 + 0.1 * torch.randn(d, device="cuda", generator=g)).to(dtype).requires_grad_()
    dy = torch.randn(rows, d, device="cuda", generator=g).to(dtype)

    def fwd_bwd(f):
        def step():
            x.grad = w.grad = None
            f(x, w, EPS).backward(dy)

        return step

    def fwd(f):
        return lambda: f(x.detach(), w.detach(), EPS)

    def checked(x_, w_, eps):
        K._FAST_LAUNCH = False
        try:
            return K.rms_norm(x_, w_, eps)
        finally:
            K._FAST_LAUNCH = True

    variants = {
        "F.rms_norm": lambda a, b, e: F.rms_norm(a, (a.shape[-1],), b, e),
        "paracheck (prepared)": K.rms_norm,
        "paracheck (triton launch)": checked,
        "empty autograd.Function": lambda a, b, e: _Empty.apply(a, b),
    }
    liger = B.liger_rms_norm()
    if liger is not None:
        variants["Liger-Kernel"] = liger
    lines = [f"### host us per call, {rows}x{d} {dtype}", "", "| variant | fwd | fwd+bwd |"]
    lines.append("| --- | --- | --- |")
    for name, f in variants.items():
        lines.append(f"| {name} | {host_us(fwd(f)):.1f} | {host_us(fwd_bwd(f)):.1f} |")
    torch.autograd.set_multithreading_enabled(False)
    try:
        for name in ("F.rms_norm", "paracheck (prepared)"):
            t = host_us(fwd_bwd(variants[name]))
            lines.append(f"| {name}, backward on the calling thread | | {t:.1f} |")
    finally:
        torch.autograd.set_multithreading_enabled(True)
    y = torch.empty_like(x)
    lines.append(f"| torch.empty | {host_us(lambda: torch.empty_like(y)):.1f} | |")
    lines.append(f"| aten add | {host_us(lambda: torch.add(y, y)):.1f} | |")
    # One direct launch of the prepared forward, arguments ready.
    K.rms_norm(x.detach(), w.detach(), EPS)
    prep = next(p for p in K._PREPARED.values() if (p.n_rows, p.n_cols) == (rows, d))
    rstd = torch.empty(rows, device="cuda")
    stream = torch._C._cuda_getCurrentRawStream(0)

    def launch():
        prep.forward(stream, x, w, y, rstd, d, d, rows, d, EPS)

    lines.append(f"| one direct launch | {host_us(launch):.1f} | |")
    return lines


def lm_table(sizes, dtypes, steps, mode="eager") -> list[str]:
    """``paracheck.bench.lm.time_lm_steps`` per size and dtype, as a table."""
    from paracheck.bench.lm import LM_NORMS, time_lm_steps

    lines = [
        f"### LM step (zero_grad, fwd, loss, bwd, fused AdamW), batch 4 x 256, {mode}, ms",
        "",
        "| size | dtype | norm | step median | host enqueue median | step / torch |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for size in sizes:
        for dtype in dtypes:
            t = time_lm_steps(size, bf16=dtype == "bf16", mode=mode, steps=steps)
            for norm in LM_NORMS:
                lines.append(
                    f"| {size} | {dtype} | {norm} | {t[norm][0]:.2f} | {t[norm][1]:.2f} | "
                    f"{t[norm][0] / t['torch'][0]:.3f} |"
                )
            print("\n".join(lines[-len(LM_NORMS) :]), flush=True)
    return lines


class _Boundary(torch.autograd.Function):
    """``F.rms_norm``'s forward behind a Python Function boundary; a backward that does no work."""

    @staticmethod
    def forward(ctx, x, w, eps):
        ctx.dw = torch.zeros_like(w)
        return F.rms_norm(x, (x.shape[-1],), w, eps)

    @staticmethod
    def backward(ctx, dy):
        return dy, ctx.dw, None


class _BoundaryNorm(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d, device="cuda"))

    def forward(self, x):
        return _Boundary.apply(x, self.weight, EPS)


def boundary_table(sizes, dtypes, steps) -> list[str]:
    """The Triton norm's prepared-path hits in the LM, and the step with a Function boundary
    around ``F.rms_norm`` (``_Boundary``) beside the three norms of ``time_lm_steps``."""
    import paracheck.bench.lm as L

    plain = L._lm_with_norm

    def with_boundary(size, norm):
        if norm != "boundary":
            return plain(size, norm)
        net = plain(size, "torch")
        for mod in list(net.modules()):
            for child in ("ln1", "ln2", "ln_final"):
                if hasattr(mod, child):
                    setattr(mod, child, _BoundaryNorm(getattr(mod, child).weight.shape[0]))
        return net

    # Prepared-path hits: _fast_ok is asked once per forward and once per backward that found a
    # prepared signature; every call of a norm counts once per pass.
    fast_ok, hits, calls = K._fast_ok, [0], [0]

    def counting(device):
        ok = fast_ok(device)
        hits[0] += ok
        return ok

    lines = ["", "### LM step, eager, with a Function boundary around F.rms_norm, ms", ""]
    lines += [
        "| size | dtype | norm | step median | host enqueue median | step / torch | prepared hits |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    norms = ("torch", "triton", "boundary", "none")
    L._lm_with_norm = with_boundary
    K._fast_ok = counting
    original_forward = K.TritonRMSNorm.forward

    def counted_forward(self, x):
        calls[0] += 1
        return original_forward(self, x)

    K.TritonRMSNorm.forward = counted_forward
    try:
        for size in sizes:
            for dtype in dtypes:
                hits[0] = calls[0] = 0
                t = L.time_lm_steps(size, bf16=dtype == "bf16", steps=steps, norms=norms)
                share = f"{hits[0]} of {2 * calls[0]} passes"
                for norm in norms:
                    lines.append(
                        f"| {size} | {dtype} | {norm} | {t[norm][0]:.2f} | {t[norm][1]:.2f} | "
                        f"{t[norm][0] / t['torch'][0]:.3f} | {share if norm == 'triton' else ''} |"
                    )
                print("\n".join(lines[-len(norms) :]), flush=True)
    finally:
        L._lm_with_norm, K._fast_ok, K.TritonRMSNorm.forward = plain, fast_ok, original_forward
    return lines


SHAPES = [(4096, 1024), (4096, 2048), (4096, 4096), (4096, 8192), (16384, 1600), (8192, 4096)]


def gpu_ms(fn, reps=15) -> float:
    """Median GPU time, L2 flushed by a read, the host queued ahead (bench.rmsnorm's timer)."""
    from paracheck.bench.rmsnorm import events_ms

    return events_ms(fn, reps=reps)


def plan_table() -> list[str]:
    """bf16 and fp32 fwd+bwd GPU time per launch plan: the default, and tiles of twice the rows
    (the same bytes per tile as float32) with several warps and programs per SM."""
    import dataclasses

    lines = ["### fwd+bwd GPU us per plan (events, L2 flushed)", ""]
    lines.append("| shape | dtype | F.rms_norm | default | best alternative | its plan |")
    lines.append("| --- | --- | --- | --- | --- | --- |")
    for dtype in (torch.bfloat16, torch.float32):
        for rows, d in SHAPES:
            g = torch.Generator(device="cuda").manual_seed(0)
            x = torch.randn(rows, d, device="cuda", generator=g).to(dtype)
            w = (1 + 0.1 * torch.randn(d, device="cuda", generator=g)).to(dtype)
            dy = torch.randn(rows, d, device="cuda", generator=g).to(dtype)
            base = K._plan_of(x)
            n_sms = K.sm_count(x.device)

            def seq(plan):
                def run():
                    _, rstd = K._rms_norm_forward(x, w, EPS, K.KERNELS, plan)
                    K._rms_norm_backward(dy, x, w, rstd, K.KERNELS, plan)

                return run

            xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()

            def torch_step():
                xg.grad = wg.grad = None
                F.rms_norm(xg, (d,), wg, EPS).backward(dy)

            ref = gpu_ms(torch_step) * 1e3
            default = gpu_ms(seq(base)) * 1e3
            best = (float("inf"), None)
            hints = dict(
                x_evict=base.x_evict, y_evict=base.y_evict, bwd_load_evict=base.bwd_load_evict
            )
            for rmul in (1, 2, 4):
                r = min(base.fwd_rows * rmul, 64)
                for fw in (4, 8, 16):
                    for bw in (4, 8, 16):
                        for per_sm in (1, 2):
                            plan = K.gpu_plan(
                                rows, d, n_sms=n_sms, fwd_rows=r, fwd_warps=fw,
                                bwd_rows=r, bwd_warps=bw, bwd_per_sm=per_sm, **hints,
                            )  # fmt: skip
                            plan = dataclasses.replace(plan, bwd_reverse=base.bwd_reverse)
                            try:
                                t = gpu_ms(seq(plan), reps=9) * 1e3
                            except Exception:
                                continue
                            if t < best[0]:
                                best = (t, (r, fw, bw, per_sm))
            lines.append(
                f"| {rows}x{d} | {dtype} | {ref:.1f} | {default:.1f} | {best[0]:.1f} | "
                f"rows {best[1][0]}, fwd warps {best[1][1]}, bwd warps {best[1][2]}, "
                f"{best[1][3]}/SM |"
            )
            print(lines[-1], flush=True)
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--what", default="host,lm")
    ap.add_argument("--sizes", default="small,medium,xl")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure")
        return 0
    what = args.what.split(",")
    lines = [f"{torch.cuda.get_device_name()}, torch {torch.__version__}"]
    if "host" in what:
        for d in (768, 1600):
            for dtype in (torch.float32, torch.bfloat16):
                lines += host_table(1024, d, dtype) + [""]
                print("\n".join(lines[-14:]), flush=True)
    for mode in ("lm", "graph", "compile"):
        if mode in what:
            lines += lm_table(
                args.sizes.split(","),
                args.dtypes.split(","),
                args.steps,
                mode="eager" if mode == "lm" else mode,
            )
    if "plans" in what:
        lines += plan_table()
    if "boundary" in what:
        lines += boundary_table(args.sizes.split(","), args.dtypes.split(","), args.steps)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
