"""What ``paracheck bench`` measures and prints (``paracheck.cli.bench`` parses the options):
one step per part of ``--what``, each printing its table as it finishes and filling the record."""

from __future__ import annotations

import time

__all__ = ["run_bench", "run_lm"]


def mib(n) -> str:
    return f"{n / 2**20:,.1f}"


def _gib(n) -> str:
    return f"{n / 2**30:,.2f}"


def bench_table(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def say(text="") -> None:
    print(text, flush=True)


def run_bench(args, world, record: dict) -> None:
    """Run the parts of ``args.what`` on ``world``, print tables, fill ``record``."""
    from paracheck.bench.variants import available_variants

    variants = available_variants(args.variants or None, include_local=True)
    skipped = [v for v in (args.variants or ()) if v not in variants]
    if skipped:
        say(f"skipped (not available here): {', '.join(skipped)}")
    if "step" in args.what:
        _bench_steps(args, world, record, variants)
    if "bucket" in args.what:
        _bench_buckets(args, world, record)
    if "allreduce" in args.what:
        _bench_allreduce(args, world, record)
    if "overlap" in args.what:
        _bench_overlap(args, world, record)


def _spec_for(args, variant, model, **kw):
    """The ``StepSpec`` of ``variant`` on ``model`` under ``args`` (one rank for ``local``)."""
    from paracheck.bench.step import StepSpec
    from paracheck.bench.suites import model_for

    w = 1 if variant == "local" else args.world_size
    return StepSpec(
        variant,
        model_for(model),
        world_size=w,
        batch=args.batch,
        warmup=args.warmup,
        steps=args.steps,
        bucket_mb=kw.get("bucket_mb", args.bucket_mb),
    )


def _bench_steps(args, world, record: dict, variants) -> None:
    """Step time and memory of every variant, per model size (``step``)."""
    from paracheck.bench.step import account_step, time_step

    cuda = args.device == "cuda"
    W = args.world_size
    for size in args.sizes:
        rows = []
        first = len(record["step"])
        say(
            f"\n### step time and memory: {size}, {W} ranks, batch {args.batch}/rank ({'cuda' if cuda else 'cpu'})\n"
        )
        for v in variants:
            spec = _spec_for(args, v, size)
            t0 = time.monotonic()
            try:
                timing = time_step(world, spec, timeout=args.timeout)
                acct = account_step(world, spec, timeout=args.timeout) if args.exact else None
            except Exception as exc:  # noqa: BLE001 - one variant failing (OOM) must not end the run
                say(f"{v}: failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                record["step"].append(
                    {"spec": spec.to_dict(), "error": f"{type(exc).__name__}: {exc}"[:2000]}
                )
                continue
            entry = {**timing.to_dict(), "account": acct.to_dict() if acct else None}
            record["step"].append(entry)
            mem = timing.cuda_memory
            row = [v, f"{timing.median * 1e3:.1f}"]
            if cuda:
                row += [
                    _gib(mem["init"]),
                    _gib(mem["before_step"]),
                    _gib(mem["after_step"]),
                    _gib(mem["peak"]),
                    _gib(timing.start_bytes),
                    _gib(timing.left_bytes),
                ]
            else:
                row += [f"{timing.cpu_min * 1e3:.1f}", mib(timing.rss_peak)]
            if acct:
                row += [
                    acct.collectives,
                    mib(acct.bus_bytes),
                    mib(acct.optimizer_state_bytes),
                    mib(acct.peak_bytes),
                    mib(acct.checkpoint_save_bytes),
                    mib(acct.checkpoint_load_bytes),
                    mib(acct.peak_load_bytes),
                ]
            rows.append(row)
            say(f"  {v}: {timing.median * 1e3:.1f} ms ({time.monotonic() - t0:.0f} s)")
        header = ["variant", "step ms (median)"]
        if cuda:
            # Above what the ranks held when the job started (start), and what the job
            # left behind (left): Note [Measuring from a clean state].
            header += [
                "init GiB",
                "before step GiB",
                "after step GiB",
                "peak GiB",
                "start GiB",
                "left GiB",
            ]
        else:
            header += ["cpu ms (min)", "rank RSS peak MiB"]
        if args.exact:
            header += [
                "collectives/step",
                "bus MiB/step",
                "opt state MiB/rank",
                "tensor peak MiB/rank",
                "save writes MiB/rank",
                "load reads MiB/rank",
                "load peak MiB/rank",
            ]
        say("\n" + bench_table(header, rows))
        if args.exact:
            _print_schedules(record["step"][first:])


def _bench_buckets(args, world, record: dict) -> None:
    """Bucketed DDP's and torch DDP's step time per bucket size, and the fitted model (``bucket``)."""
    from paracheck.bench.bucket_model import fit_bucket_model
    from paracheck.bench.step import time_step
    from paracheck.bench.variants import available_variants
    from paracheck.report.plots import bucket_model_table

    W = args.world_size
    model = args.bucket_model
    rows = []
    say(f"\n### bucket sweep: {model}, {W} ranks\n")
    for v in available_variants(("bucketed", "torch-ddp")):
        for mb in args.buckets:
            spec = _spec_for(args, v, model, bucket_mb=float(mb))
            try:
                timing = time_step(world, spec, timeout=args.timeout)
            except Exception as exc:  # noqa: BLE001
                say(f"{v} {mb} MB: failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                continue
            record["bucket"].append(timing.to_dict())
            rows.append([v, mb, f"{timing.median * 1e3:.1f}"])
            say(f"  {v} {mb} MB: {timing.median * 1e3:.1f} ms")
    say("\n" + bench_table(["variant", "bucket MB", "step ms (median)"], rows))
    fits = []
    for v in dict.fromkeys(r[0] for r in rows):
        pts = [(float(r[1]), float(r[2])) for r in rows if r[0] == v]
        if len({mb for mb, _ in pts}) >= 3:  # Note [Bucket-size model]
            fits.append((v, pts, fit_bucket_model(pts)))
    if fits:
        say("\n" + bucket_model_table(fits))


def _bench_allreduce(args, world, record: dict) -> None:
    """All-reduce time and bus bandwidth per size and world size (``allreduce``)."""
    from paracheck.bench.comm import all_reduce_time

    rows = []
    sizes = (
        args.allreduce_world_sizes or tuple(w for w in (2, 4) if w <= world.size) or (world.size,)
    )
    say(f"\n### all-reduce ({world.backend}), float32\n")
    for w in sizes:
        for mb in args.allreduce_mb:
            r = all_reduce_time(world, mb, w, timeout=args.timeout)
            record["allreduce"].append(r.to_dict())
            rows.append([world.backend, w, mb, f"{r.median * 1e3:.3f}", f"{r.busbw / 1e9:.2f}"])
            say(f"  W={w} {mb} MB: {r.median * 1e3:.3f} ms, busbw {r.busbw / 1e9:.2f} GB/s")
    say("\n" + bench_table(["backend", "ranks", "MB", "ms (median)", "bus GB/s"], rows))


def _bench_overlap(args, world, record: dict) -> None:
    """The share of communication hidden under compute, from CUDA timelines (``overlap``)."""
    from paracheck.bench.variants import available_variants

    W = args.world_size
    if args.device != "cuda":
        say("\noverlap: skipped (measured from CUDA kernel timelines; needs --device cuda)")
        return
    from paracheck.bench.overlap import overlap_share

    rows = []
    say(f"\n### overlap: {args.overlap_model}, {W} ranks\n")
    for v in available_variants(("overlapped", "bucketed", "torch-ddp")):
        try:
            o = overlap_share(world, _spec_for(args, v, args.overlap_model), timeout=args.timeout)
        except Exception as exc:  # noqa: BLE001
            say(f"{v}: failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
            continue
        record["overlap"].append(o.to_dict())
        rows.append(
            [
                v,
                f"{o.comm_ms_per_step:.2f}",
                f"{o.hidden_ms_per_step:.2f}",
                f"{o.share:.0%}",
            ]
        )
        say(f"  {v}: {o.share:.0%} of {o.comm_ms_per_step:.2f} ms hidden")
    say("\n" + bench_table(["variant", "comm ms/step", "hidden ms/step", "hidden share"], rows))


def _print_schedules(entries: list) -> None:
    """The exact communication schedule of each variant's step (Note [Communication schedule of
    a step] in ``paracheck.accounting.schedule``): its derived quantities, then its events."""
    from paracheck.accounting.schedule import StepSchedule

    measured = [e for e in entries if e.get("account") and e["account"].get("schedule")]
    if not measured:
        return
    rows = []
    for e in measured:
        a = e["account"]
        rows.append(
            [
                e["spec"]["variant"],
                mib(a["bytes_before_backward_end"]),
                a["launches_after_backward"],
                mib(a["bytes_after_backward"]),
                a["waits_in_backward"],
                a["device_syncs"],
                f"{a['exposed_comm_pct_balanced']:.1f}%",
                f"{a['exposed_comm_us_pcie4']:.1f}",
                f"{a['exposed_comm_us_nvlink_h100']:.1f}",
                f"{a['host_calls']} ({a.get('world_calls', 0)})",
            ]
        )
    header = [
        "variant",
        "MiB launched in backward (higher is better)",
        "launches after backward",
        "MiB after backward",
        "waits in backward",
        "device syncs",
        "exposed comm, balanced link",
        "exposed us, pcie4",
        "exposed us, nvlink-h100",
        "host calls (in paracheck.world)",
    ]
    say("\n### exact communication schedule (per rank and step; lower is better unless marked)\n")
    say(bench_table(header, rows))
    for e in measured:
        sched = StepSchedule.from_dict(e["account"]["schedule"])
        say(f"\n{e['spec']['variant']}:\n" + sched.table())


def run_lm(args, record: dict) -> None:
    """Time forward / backward / step of one process per ``args.sizes``, print a table, fill
    ``record["lm"]``."""
    from paracheck.bench.lm import time_lm
    from paracheck.bench.suites import model_for

    rows = []
    device = "cuda" if args.device == "cuda" else "cpu"
    say(f"\n### forward / backward / step, one process ({device}), batch {args.batch}\n")
    for size in args.sizes:
        for ac in (False, True):
            r = time_lm(
                model_for(size),
                batch=args.batch,
                autocast=ac,
                device=device,
                steps=max(3, args.steps // 2),
            )
            record["lm"].append({"size": size, **r.to_dict()})
            m = r.medians
            rows.append(
                [
                    size,
                    "bf16" if ac else "fp32",
                    *(f"{m[k] * 1e3:.1f}" for k in ("forward", "backward", "step")),
                ]
            )
            say(
                f"  {size} {'bf16' if ac else 'fp32'}: "
                + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in m.items())
            )
    say("\n" + bench_table(["model", "autocast", "forward ms", "backward ms", "step ms"], rows))
