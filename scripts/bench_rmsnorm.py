"""RMSNorm forward+backward effective bandwidth on one GPU, float32.

Variants: paracheck's Triton kernel, ``F.rms_norm``, the eager formula and ``torch.compile`` of
the eager formula. Effective bandwidth counts x, y, dy and dx once each (4 * rows * d * 4 bytes)
over the median time of one forward+backward, gradients reset to None before each call (so no
accumulation kernel runs). Each variant is first checked against the float64 oracle on the same
inputs. Device copy bandwidth (a 2 GiB device-to-device copy, bytes read + written) is measured
in the same run, by the same timer, as the ceiling.

Timers (both medians; Note [timing] in ``paracheck.bench.rmsnorm``, which holds the measuring
code this script shares with the asv GPU tier): ``events`` (the main table: GPU time, L2 flushed
by a read, host queued ahead) and ``triton.testing.do_bench`` (zero-fill flush, host time
included when the host is the slower side); the host time per call has its own table.

    PYTHONPATH=src python scripts/bench_rmsnorm.py            # tables (written to $OUT too)
    PYTHONPATH=src python scripts/bench_rmsnorm.py --sweep    # also time launch plans
    PYTHONPATH=src python scripts/bench_rmsnorm.py --summary --model   # GPU and back-to-back
        # time per shape against F.rms_norm, torch.compile and Liger-Kernel (if installed), in
        # fp32 and bf16, and the LM's step with each norm, eager and CUDA-graphed
    TRITON_INTERPRET=1 PYTHONPATH=src python scripts/bench_rmsnorm.py --smoke  # CPU: code paths only
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time

import torch

from paracheck.bench import rmsnorm as B
from paracheck.bench.rmsnorm import EPS, eager_rms_norm, tbps, torch_rms_norm

SHAPES = list(B.SHAPES)
DEVICE = "cuda"
SMOKE = False


def events_ms(fn, **kw):
    return B.events_ms(fn, device=DEVICE, **kw)


def do_bench_ms(fn, **kw):
    return B.do_bench_ms(fn, device=DEVICE, **kw)


def host_us(fn, **kw):
    return B.host_us(fn, device=DEVICE, **kw)


def inputs(rows, d, seed=0):
    return B.rmsnorm_inputs(rows, d, seed=seed, device=DEVICE)


check = B.check_against_oracle
step_fn = B.step_fn


def triton_variant(*, dependent_launch=True):
    """paracheck's kernel with its launch switch set for this call and its backward."""
    from paracheck.kernels import rmsnorm as K

    def fn(x, weight, eps):
        K._USE_PDL = dependent_launch
        return K.rms_norm(x, weight, eps)

    return fn


# Ablation of the launch measure (Note [dependent launch] in paracheck/kernels/rmsnorm.py),
# timed beside the default with --variants.
ABLATIONS = {"triton: no dependent launch": dict(dependent_launch=False)}


# ------------------------------------------------------------------------------------------
# Diagnostics: the GPU timeline of one call.


def kernel_timeline(fn, x, w, dy, reps=10) -> str:
    """Each kernel of one fwd+bwd (L2 flushed, host queued ahead) with the gap before it, and
    the span from the first kernel's start to the last one's end; medians over ``reps``."""
    import json
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    flush = torch.ones(2**26, device=DEVICE)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch.cuda._sleep(1000)
        torch.cuda.synchronize()
    sleep_names = {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}
    step, grads = step_fn(fn, x, w, dy)
    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            for t in grads:
                t.grad = None
            flush.sum()
            torch.cuda._sleep(1_000_000)
            step()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.load(open(f.name))["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    calls, current = [], None
    for e in kernels:  # the kernels after each sleep kernel, up to the next flush, are a call
        name = e["name"]
        if name in sleep_names:
            current = []
            calls.append(current)
        elif current is not None and "reduce" in name.lower() and e["dur"] > 20:
            current = None  # the 256 MiB flush
        elif current is not None:
            current.append(e)
    calls = [c for c in calls if c]
    if not calls:
        return "no kernels found"
    n = min(len(c) for c in calls)
    parts = []
    for i in range(n):
        dur = statistics.median(c[i]["dur"] for c in calls)
        gap = (
            statistics.median((c[i]["ts"] - c[i - 1]["ts"] - c[i - 1]["dur"]) for c in calls)
            if i
            else 0.0
        )
        short = calls[0][i]["name"].split("(")[0][-40:]
        parts.append(f"[gap {gap:.1f}] {short} {dur:.1f}")
    span = statistics.median(c[-1]["ts"] + c[-1]["dur"] - c[0]["ts"] for c in calls)
    return f"span {span:.1f} us: " + ", ".join(parts)


# ------------------------------------------------------------------------------------------
# Diagnostics: where the host time of one triton fwd+bwd goes.


def profile_host(fn, x, w, dy, lines):
    step, grads = step_fn(fn, x, w, dy)
    step()
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            for t in grads:
                t.grad = None
            step()
        torch.cuda.synchronize()
    table = prof.key_averages().table(
        sort_by="cpu_time_total", row_limit=18, max_name_column_width=50
    )
    lines += ["", "```", table, "```"]
    from paracheck.kernels import rmsnorm as K

    y, rstd = K._rms_norm_forward(x, w, EPS, K.KERNELS)
    for name, f in {
        "fwd launcher": lambda: K._rms_norm_forward(x, w, EPS, K.KERNELS),
        "bwd launchers (2)": lambda: K._rms_norm_backward(dy, x, w, rstd, K.KERNELS),
        "torch.empty_like": lambda: torch.empty_like(x),
        "autograd fwd only": lambda: fn(grads[0], grads[1], EPS),
        "autograd fwd+bwd": step,
    }.items():
        lines.append(f"host {name}: {host_us(f, grad_to_none=grads, n=50):.1f} us")


# ------------------------------------------------------------------------------------------
# Sweep of launch plans (the kernels' free parameters and cache hints).


def sweep(rows, d, lines):
    """Each pass alone over launch plans, then whole fwd+bwd sequences with cache hints."""
    from paracheck.kernels import rmsnorm as K

    x, w, dy = inputs(rows, d)
    n_sms = K.sm_count(x.device)
    base = K.launch_plan(rows, d, interpreted=DEVICE != "cuda", n_sms=n_sms)
    block_d = base.block_d
    lines.append(f"\n### {rows}x{d} (default plan {base})\n")
    lines.append("| pass | rows/tile | warps | programs/SM | hints x/y/bwd | TB/s |")
    lines.append("| --- | --- | --- | --- | --- | --- |")
    results = []

    def timed(key, fn, nbytes):
        try:
            results.append((*key, tbps(nbytes, events_ms(fn, reps=15))))
        except Exception as e:  # a plan that does not compile or launch: report, go on
            lines.append(f"<!-- {key}: {type(e).__name__}: {str(e)[:160]} -->")

    def tiles(lo, hi):
        for r in (1, 2, 4, 8):
            for warps in (4, 8, 16, 32):
                if lo <= r * block_d // (32 * warps) <= hi and r <= rows:
                    yield r, warps

    hints = dict(x_evict=base.x_evict, y_evict=base.y_evict, bwd_load_evict=base.bwd_load_evict)
    hint_text = "/".join(h or "-" for h in hints.values())
    for r, warps in tiles(8, 64):
        plan = dataclasses.replace(base, fwd_rows=r, fwd_warps=warps)
        timed(
            ("fwd", r, warps, "-", hint_text),
            lambda: K._rms_norm_forward(x, w, EPS, K.KERNELS, plan),
            2 * rows * d * 4,
        )
    _, rstd = K._rms_norm_forward(x, w, EPS, K.KERNELS)
    for r, warps in tiles(8, 32):
        for per_sm in (1, 2, 4):
            plan = K.gpu_plan(
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
            timed(
                ("bwd", r, warps, per_sm, hint_text),
                lambda: K._rms_norm_backward(dy, x, w, rstd, K.KERNELS, plan),
                3 * rows * d * 4,
            )
    for combo in [
        ("evict_last", "", ""),
        ("", "", ""),
        ("evict_last", "evict_first", "evict_first"),
    ]:
        plan = dataclasses.replace(base, **dict(zip(hints, combo)))

        def seq():
            K._rms_norm_backward(
                dy, x, w, K._rms_norm_forward(x, w, EPS, K.KERNELS, plan)[1], K.KERNELS, plan
            )

        timed(
            (
                "fwd+bwd",
                f"{base.fwd_rows}/{base.bwd_rows}",
                f"{base.fwd_warps}/{base.bwd_warps}",
                "default",
                "/".join(h or "-" for h in combo),
            ),
            seq,
            4 * rows * d * 4,
        )
    for pass_, k in (("fwd", 4), ("bwd", 6), ("fwd+bwd", 3)):
        best = sorted((t for t in results if t[0] == pass_), key=lambda t: -t[-1])
        for t in best[:k]:
            lines.append(f"| {t[0]} | {t[1]} | {t[2]} | {t[3]} | {t[4]} | {t[5]:.2f} |")
    print("\n".join(lines[-16:]), flush=True)


def host_breakdown(x, w, dy, lines):
    """Host time of the pieces of one triton fwd+bwd, and which thread runs them."""
    import collections
    import threading

    from paracheck.kernels import rms_norm
    from paracheck.kernels import rmsnorm as K

    spans = collections.defaultdict(list)
    orig_fwd, orig_bwd, orig_getitem = (
        K._rms_norm_forward,
        K._rms_norm_backward,
        K.LazyJit.__getitem__,
    )

    def wrap(name, f):
        def inner(*a, **k):
            t0 = time.perf_counter()
            out = f(*a, **k)
            spans[f"{name} [{threading.current_thread().name}]"].append(time.perf_counter() - t0)
            return out

        return inner

    def getitem(self, grid):
        return wrap(f"launch {self.fn.__name__}", orig_getitem(self, grid))

    step, grads = step_fn(rms_norm, x, w, dy)
    K._rms_norm_forward, K._rms_norm_backward = (
        wrap("_rms_norm_forward", orig_fwd),
        wrap("_rms_norm_backward", orig_bwd),
    )
    K.LazyJit.__getitem__ = getitem
    try:
        for _ in range(30):
            for t in grads:
                t.grad = None
            step()
        if not SMOKE:
            torch.cuda.synchronize()
    finally:
        K._rms_norm_forward, K._rms_norm_backward = orig_fwd, orig_bwd
        K.LazyJit.__getitem__ = orig_getitem
    for name, ts in sorted(spans.items()):
        lines.append(f"host {name}: median {statistics.median(ts) * 1e6:.1f} us over {len(ts)}")
    torch.autograd.set_multithreading_enabled(False)
    try:
        lines.append(
            f"host autograd fwd+bwd, backward on the calling thread "
            f"(set_multithreading_enabled(False)): {host_us(step, grad_to_none=grads, n=50):.1f} us"
        )
    finally:
        torch.autograd.set_multithreading_enabled(True)
    lines.append(
        f"host autograd fwd+bwd, default: {host_us(step, grad_to_none=grads, n=50):.1f} us"
    )


# ------------------------------------------------------------------------------------------
# Summary: what users feel, per shape and in the model.

SUMMARY_SHAPES = [
    (4096, 1024),
    (4096, 2048),
    (4096, 4096),
    (4096, 8192),
    (16384, 1600),
    (8192, 4096),
]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def summary(dtype_names, use_compile, lines):
    """Per dtype and shape: GPU time (events, L2 flushed, host queued ahead) and back-to-back
    time (30 calls queued, wall per call) of each variant, a device copy of the same bytes, and
    paracheck's speed-ups (peer time / paracheck time)."""
    liger = B.liger_rms_norm()
    for dname in dtype_names:
        dtype = DTYPES[dname]
        names = ["paracheck", "F.rms_norm"]
        names += [] if not use_compile else ["torch.compile"]
        names += [] if liger is None else ["Liger-Kernel"]
        peers = [n for n in names if n != "paracheck"]
        lines += [
            "",
            f"### {dname}: fwd+bwd, us (GPU / back to back); speed-up = peer time / paracheck's",
            "",
            "| shape | "
            + " | ".join(names)
            + " | copy, same bytes | "
            + " | ".join(f"GPU vs {p}" for p in peers)
            + " | "
            + " | ".join(f"b2b vs {p}" for p in peers)
            + " | % of copy bandwidth |",
            "| --- " * (len(names) + 3 + 2 * len(peers)) + "|",
        ]
        for rows, d in SUMMARY_SHAPES:
            x, w, dy = B.rmsnorm_inputs(rows, d, device=DEVICE, dtype=dtype)
            fns = {"paracheck": B.triton_rms_norm, "F.rms_norm": torch_rms_norm}
            if use_compile:
                torch._dynamo.reset()
                fns["torch.compile"] = torch.compile(eager_rms_norm, dynamic=False)
            if liger is not None:
                fns["Liger-Kernel"] = liger
            gpu, b2b = {}, {}
            for name, fn in fns.items():
                check(name, fn, x, w, dy)
                step, grads = step_fn(fn, x, w, dy)
                gpu[name] = events_ms(step, grad_to_none=grads) * 1e3
                b2b[name] = B.loop_us(step, grad_to_none=grads, device=DEVICE)
            src = torch.randn(2 * rows * d, device=DEVICE).to(dtype)
            dst = torch.empty_like(src)
            copy = events_ms(lambda: dst.copy_(src)) * 1e3  # reads + writes 4*rows*d elements
            cells = [f"{gpu[n]:.1f} / {b2b[n]:.1f}" for n in names]
            cells.append(f"{copy:.1f}")
            cells += [f"{gpu[p] / gpu['paracheck']:.2f}x" for p in peers]
            cells += [f"{b2b[p] / b2b['paracheck']:.2f}x" for p in peers]
            cells.append(f"{100 * copy / gpu['paracheck']:.0f}%")
            lines.append(f"| {rows}x{d} | " + " | ".join(cells) + " |")
            print(lines[-1], flush=True)


def model_table(sizes, modes, lines):
    """The LM's whole step with each norm (``paracheck.bench.lm.time_lm_steps``)."""
    from paracheck.bench.lm import LM_NORMS, time_lm_steps

    lines += [
        "",
        "### LM step, batch 4 x 256, fused AdamW, medians of 10 interleaved steps, ms",
        "",
        "| size | dtype | mode | norm=torch | norm=triton | no norm | triton / torch | "
        "no norm / torch |",
        "| --- " * 8 + "|",
    ]
    for mode in modes:
        for size in sizes:
            for bf16 in (False, True):
                t = time_lm_steps(size, bf16=bf16, mode=mode, norms=LM_NORMS)
                torch_ms, triton_ms, none_ms = (t[n][0] for n in LM_NORMS)
                lines.append(
                    f"| {size} | {'bf16 autocast' if bf16 else 'fp32/TF32'} | {mode} | "
                    f"{torch_ms:.2f} | {triton_ms:.2f} | {none_ms:.2f} | "
                    f"{triton_ms / torch_ms:.3f} | {none_ms / torch_ms:.3f} |"
                )
                print(lines[-1], flush=True)


def main(argv=None) -> int:
    global DEVICE, SHAPES, SMOKE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="also time launch plans")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--profile", action="store_true", help="profile one triton fwd+bwd")
    parser.add_argument(
        "--variants",
        action="store_true",
        help="also time the ablations of the launch measures (ABLATIONS)",
    )
    parser.add_argument(
        "--kernels",
        action="store_true",
        help="GPU timeline per shape: each kernel's duration and the gaps",
    )
    parser.add_argument(
        "--summary",
        action="store_true",
        help="GPU and back-to-back time per shape against every peer (rmsnorm_summary.md)",
    )
    parser.add_argument("--dtypes", default="fp32,bf16", help="for --summary: fp32,bf16,fp16")
    parser.add_argument(
        "--model",
        action="store_true",
        help="the LM's step with each norm, eager and CUDA-graphed (rmsnorm_model.md)",
    )
    parser.add_argument("--sizes", default="small,medium,xl", help="for --model")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="CPU under TRITON_INTERPRET=1, tiny shapes, wall-clock timer: "
        "checks the code paths, measures nothing",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        DEVICE, SHAPES, SMOKE = "cpu", [(64, 100), (8, 1024)], True
    elif not torch.cuda.is_available():
        print("no CUDA device: nothing to benchmark (skipped)")
        return 0
    import triton

    from paracheck.kernels import rms_norm

    out_dir = os.environ.get("OUT")
    if args.summary or args.model:
        if SMOKE:
            print("--summary and --model need CUDA")
            return 2
        lines = [
            f"{torch.cuda.get_device_name()}; torch {torch.__version__}, "
            f"triton {triton.__version__}; eps={EPS}"
        ]
        if args.summary:
            summary(args.dtypes.split(","), not args.no_compile, lines)
        if args.model:
            model_table(args.sizes.split(","), ("eager", "graph"), lines)
        text = "\n".join(lines)
        print(text, flush=True)
        if out_dir:
            with open(os.path.join(out_dir, "rmsnorm_summary.md"), "w") as f:
                f.write(text + "\n")
        return 0

    def write(name, text):
        if out_dir:
            with open(os.path.join(out_dir, name), "w") as f:
                f.write(text + "\n")

    device_name = (
        f"{torch.cuda.get_device_properties(0).name}, "
        f"{torch.cuda.get_device_properties(0).multi_processor_count} SMs"
        if DEVICE == "cuda"
        else "CPU (Triton interpreter, smoke run)"
    )
    n_copy = 2**29 if DEVICE == "cuda" else 2**20
    copy_ev = B.copy_tbps(n_copy, device=DEVICE, timer=B.events_ms)
    copy_db = B.copy_tbps(n_copy, device=DEVICE, timer=B.do_bench_ms)
    header = (
        f"{device_name}; torch {torch.__version__}, triton {triton.__version__}; fp32, "
        f"eps={EPS}. Device copy (2 GiB, read+write): {copy_ev:.2f} TB/s by events, "
        f"{copy_db:.2f} TB/s by do_bench."
    )
    cols = ["triton", "F.rms_norm", "eager"] + (
        [] if args.no_compile or SMOKE else ["torch.compile"]
    )
    if args.variants:
        cols += list(ABLATIONS)
    head = (
        "| shape | " + " | ".join(cols) + " | triton / F.rms_norm | triton / copy |\n"
        "| --- | " + " | ".join("---" for _ in cols) + " | --- | --- |"
    )
    tables = {"events": [], "do_bench": [], "host": []}
    for rows, d in SHAPES:
        x, w, dy = inputs(rows, d)
        variants = {
            "triton": triton_variant(),
            "F.rms_norm": torch_rms_norm,
            "eager": eager_rms_norm,
        }
        if args.variants:
            variants.update({k: triton_variant(**v) for k, v in ABLATIONS.items()})
        if "torch.compile" in cols:
            torch._dynamo.reset()
            variants["torch.compile"] = torch.compile(eager_rms_norm, dynamic=False)
        res = {"events": {}, "do_bench": {}, "host": {}}
        for name, fn in variants.items():
            try:
                check(name, fn, x, w, dy)
                step, grads = step_fn(fn, x, w, dy)
                nbytes = 4 * rows * d * 4
                res["events"][name] = tbps(nbytes, events_ms(step, grad_to_none=grads))
                res["do_bench"][name] = tbps(nbytes, do_bench_ms(step, grad_to_none=grads))
                res["host"][name] = host_us(step, grad_to_none=grads)
            except Exception as e:  # report the failing variant in the table, keep the others
                if name == "triton":
                    raise
                print(f"{name} at {rows}x{d} failed: {type(e).__name__}: {e}", flush=True)
                for kind in res:
                    res[kind][name] = float("nan")
        for kind, copy in (("events", copy_ev), ("do_bench", copy_db)):
            r = res[kind]
            tables[kind].append(
                f"| {rows}x{d} | "
                + " | ".join(f"{r[c]:.2f}" for c in cols)
                + f" | {r['triton'] / r['F.rms_norm']:.2f}x | {100 * r['triton'] / copy:.0f}% |"
            )
        tables["host"].append(
            f"| {rows}x{d} | " + " | ".join(f"{res['host'][c]:.0f}" for c in cols) + " | | |"
        )
        text = "\n".join(
            [
                f"RMSNorm forward+backward, effective TB/s (x, y, dy, dx counted once). {header}",
                "",
                "Timer: CUDA events, L2 flushed by a read, host queued ahead (GPU time).",
                "",
                head,
                *tables["events"],
                "",
                "Timer: triton.testing.do_bench (zero-fill flush).",
                "",
                head,
                *tables["do_bench"],
                "",
                "Host time per fwd+bwd call, us.",
                "",
                head,
                *tables["host"],
            ]
        )
        print(
            tables["events"][-1], tables["do_bench"][-1], tables["host"][-1], sep="\n", flush=True
        )
        write("rmsnorm_bench.md", text)
    print(text, flush=True)
    if args.kernels and not SMOKE:
        lines = ["## GPU timeline of one fwd+bwd (torch.profiler; us; median over 10 calls)"]
        for rows, d in SHAPES:
            x, w, dy = inputs(rows, d)
            for name, fn in {
                "triton": triton_variant(),
                "F.rms_norm": torch_rms_norm,
                "triton: no dependent launch": triton_variant(dependent_launch=False),
            }.items():
                lines.append(f"{rows}x{d} {name}: " + kernel_timeline(fn, x, w, dy))
            print("\n".join(lines[-3:]), flush=True)
        write("rmsnorm_kernels.md", "\n".join(lines))
    if args.profile:
        prof_lines = []
        host_breakdown(*inputs(*SHAPES[0]), prof_lines)
        if not SMOKE:
            profile_host(rms_norm, *inputs(*SHAPES[0]), prof_lines)
        print("\n".join(prof_lines), flush=True)
        write("rmsnorm_profile.md", "\n".join(prof_lines))
    if args.sweep:
        sweep_lines = ["## Launch-plan sweep (fwd moves x+y, bwd x+dy+dx, fwd+bwd counts 4)"]
        for rows, d in SHAPES:
            sweep(rows, d, sweep_lines)
            write("rmsnorm_sweep.md", "\n".join(sweep_lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
