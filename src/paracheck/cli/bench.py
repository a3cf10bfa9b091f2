"""``paracheck bench`` and ``paracheck memory``: the tiers' measurements, printed as markdown.

``bench`` runs any of: ``step`` (step time and memory of every variant, next to torch DDP and
ZeroRedundancyOptimizer, per model), ``allreduce`` (time and bus bandwidth per size and world
size), ``bucket`` (bucketed DDP's step time per bucket size, torch DDP's beside it), ``lm``
(forward / backward / step of one process, with and without bf16 autocast) and ``overlap``
(CUDA only). Tables are printed as each finishes; ``--json`` keeps every measurement for
``paracheck report``. ``memory`` prints the exact memory breakdown and traffic per variant.
"""

from __future__ import annotations

import argparse
import json
import sys

from paracheck.cli._bench_run import bench_table, mib, run_bench, run_lm, say

__all__ = ["WHAT", "add_parsers", "cmd_bench", "cmd_memory", "run_bench", "run_lm"]

WHAT = ("step", "allreduce", "bucket", "lm", "overlap")


def _csv(text, cast=str):
    return tuple(cast(x.strip()) for x in text.split(",") if x.strip()) if text else ()


def _defaults(device: str) -> dict:
    from paracheck.bench import suites

    cuda = device == "cuda"
    return {
        "sizes": suites.GPU_SIZES if cuda else ("cpu",),
        "allreduce_mb": suites.ALLREDUCE_MB_GPU if cuda else suites.ALLREDUCE_MB_CPU,
        "allreduce_world_sizes": None,
        "buckets": suites.BUCKET_MB,
        "bucket_model": "xl" if cuda else "cpu",
        "overlap_model": "large" if cuda else "cpu",
    }


def _add_arguments(p: argparse.ArgumentParser, what_default) -> None:
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cpu: gloo ranks; cuda: NCCL ranks, one GPU each (default %(default)s)",
    )
    p.add_argument(
        "--world-size",
        type=int,
        default=2,
        help="ranks of the measured world (default %(default)s)",
    )
    p.add_argument(
        "--sizes",
        default=None,
        help="comma-separated models: gate, cpu (CPU) or small, medium, large, xl, 2.7B (default "
        "cpu on cpu; small,medium,large,xl on cuda)",
    )
    p.add_argument(
        "--variants",
        default=None,
        help="comma-separated (default: every available variant and local)",
    )
    p.add_argument("--batch", type=int, default=4, help="local batch per rank (default 4)")
    p.add_argument("--steps", type=int, default=8, help="timed steps (default 8)")
    p.add_argument(
        "--warmup", type=int, default=2, help="untimed steps before the timed ones (default 2)"
    )
    p.add_argument(
        "--bucket-mb", type=float, default=25.0, help="bucket size of the step table (default 25)"
    )
    p.add_argument(
        "--timeout", type=float, default=300.0, help="seconds one job may take (default 300)"
    )
    p.add_argument(
        "--json",
        default=None,
        help="write every measurement here, for paracheck report (default: none)",
    )
    if what_default is not None:
        p.add_argument(
            "--history",
            nargs="?",
            const="",
            default=None,
            metavar="DIR",
            help="record the step table under the current git commit in this history (without "
            "DIR: .paracheck/history of the repository), which paracheck report shows; not "
            "recorded when the working tree has uncommitted changes (default: not recorded)",
        )
        p.add_argument(
            "--what",
            default=",".join(what_default),
            help=f"comma-separated subset of {','.join(WHAT)} (default: all of them)",
        )
        p.add_argument(
            "--allreduce-mb",
            default=None,
            help="all-reduce sizes in MB (default 1,10,100 CPU; +1024 GPU)",
        )
        p.add_argument(
            "--allreduce-world-sizes", default=None, help="default: 2,4 up to the world size"
        )
        p.add_argument("--buckets", default=None, help="bucket sizes in MB (default 1,10,100,1000)")
        p.add_argument(
            "--bucket-model", default=None, help="model of the bucket sweep (default cpu / xl)"
        )
        p.add_argument(
            "--overlap-model",
            default=None,
            help="model of the overlap measurement (default cpu / large)",
        )
        p.add_argument(
            "--no-exact",
            dest="exact",
            action="store_false",
            help="skip the exact traffic/memory accounting of the step table",
        )


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add ``bench`` and ``memory`` to the subcommands ``sub``."""
    description = __doc__.split("\n\n")[0].replace("``", "")
    for name, what_default, run, line in (
        ("bench", WHAT, cmd_bench, "measure step time, memory and bandwidth: markdown tables"),
        ("memory", None, cmd_memory, "print each variant's exact memory breakdown and traffic"),
    ):
        p = sub.add_parser(name, help=line, description=description)
        _add_arguments(p, what_default)
        p.set_defaults(run=run)


def cmd_bench(args) -> int:
    """``paracheck bench``: 0 after printing the tables, 2 on a usage error."""
    from paracheck.bench.machine import machine_info

    d = _defaults(args.device)
    args.what = _csv(args.what)
    bad = [w for w in args.what if w not in WHAT]
    if bad:
        print(
            f"paracheck bench: --what={','.join(bad)} must be among {','.join(WHAT)}",
            file=sys.stderr,
        )
        return 2
    args.sizes = _csv(args.sizes) or d["sizes"]
    args.variants = _csv(args.variants)
    args.allreduce_mb = _csv(args.allreduce_mb, float) or d["allreduce_mb"]
    args.allreduce_world_sizes = _csv(args.allreduce_world_sizes, int) or d["allreduce_world_sizes"]
    args.buckets = _csv(args.buckets, float) or d["buckets"]
    args.bucket_model = args.bucket_model or d["bucket_model"]
    args.overlap_model = args.overlap_model or d["overlap_model"]
    from paracheck.bench.suites import model_for

    try:
        for m in (*args.sizes, args.bucket_model, args.overlap_model):
            model_for(m)
    except ValueError as exc:
        print(f"paracheck bench: {exc}", file=sys.stderr)
        return 2
    error = _usage_error(args, "bench")
    if error is not None:
        print(f"paracheck bench: {error}", file=sys.stderr)
        return 2
    record = {
        "machine": machine_info(args.device),
        "argv": list(args.argv or sys.argv[1:]),
        "step": [],
        "bucket": [],
        "allreduce": [],
        "lm": [],
        "overlap": [],
    }
    try:
        if "lm" in args.what:
            run_lm(args, record)
        if set(args.what) - {"lm"}:
            from paracheck.world import World

            need = max([args.world_size] + list(args.allreduce_world_sizes or ()))
            with World(
                need, backend="nccl" if args.device == "cuda" else "gloo", timeout=args.timeout
            ) as world:
                run_bench(args, world, record)
    finally:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(record, f, indent=1)
    if args.history is not None:
        _record_history(args, record)
    return 0


def _record_history(args, record: dict) -> None:
    """``--history``: the step table under HEAD of the current repository, unless the working
    tree differs from HEAD (its measurements would then not be HEAD's)."""
    import os
    import subprocess
    from dataclasses import asdict

    from paracheck.bench.suites import model_for
    from paracheck.report.store import default_history, record_bench

    def git(*a):
        return subprocess.run(["git", *a], capture_output=True, text=True)

    top = git("rev-parse", "--show-toplevel")
    if top.returncode != 0:
        say(f"not recorded in a history: {os.getcwd()} is not in a git repository")
        return
    repo = top.stdout.strip()
    if git("status", "--porcelain", "--untracked-files=no").stdout.strip():
        say("not recorded in a history: the working tree has uncommitted changes (commit first)")
        return
    sha = git("rev-parse", "HEAD").stdout.strip()
    names = {json.dumps(asdict(model_for(s)), sort_keys=True): s for s in args.sizes}
    history = args.history or default_history(repo)
    record_bench(history, repo, sha, record, names)
    say(f"recorded the step table of {sha[:10]} in {history}: `paracheck report --serve` shows it")


def _usage_error(args, prog: str) -> str | None:
    """The first bad value among the options ``bench`` and ``memory`` take, as one line naming the
    option and the value; None when all are good. Checked before any rank starts."""
    for name in ("world_size", "steps"):
        v = getattr(args, name, None)
        if v is not None and v < 1:
            return f"--{name.replace('_', '-')}={v} must be >= 1"
    for name in ("timeout", "bucket_mb"):
        v = getattr(args, name, None)
        if v is not None and not v > 0:
            return f"--{name.replace('_', '-')}={v} must be > 0"
    warmup = getattr(args, "warmup", None)
    if warmup is not None and warmup < 0:
        return f"--warmup={warmup} must be >= 0"
    for name in ("buckets", "allreduce_mb"):
        bad = [v for v in getattr(args, name, None) or () if not v > 0]
        if bad:
            return f"--{name.replace('_', '-')}: {bad[0]} must be > 0"
    sizes = [args.world_size, *(getattr(args, "allreduce_world_sizes", None) or ())]
    if min(sizes) < 1:
        return f"--allreduce-world-sizes: {min(sizes)} must be >= 1"
    if args.device == "cuda":
        import torch

        if max(sizes) > torch.cuda.device_count():
            return (
                f"--world-size={max(sizes)} exceeds the {torch.cuda.device_count()} CUDA "
                f"device(s) present (--device cuda)"
            )
    else:
        from paracheck.check.limits import world_size_error

        error = world_size_error("--world-size", str(max(sizes)), sizes, None)
        if error is not None:
            return error
    names = getattr(args, "variants", None)
    if names:
        from paracheck.bench.variants import variant_kind

        unknown = [n for n in names if variant_kind(n) is None]
        if unknown:
            return (
                f"--variants: {unknown[0]!r} is neither a baseline nor a target that imports "
                f"(paracheck {prog} --help lists them)"
            )
    return None


def cmd_memory(args) -> int:
    """``paracheck memory``: exact memory breakdown and traffic per variant (Note [Exact
    quantities]); on CUDA also the allocator's peaks at init / before / after the step."""
    from paracheck.bench.machine import machine_info
    from paracheck.bench.step import StepSpec, account_step, time_step
    from paracheck.bench.suites import model_for
    from paracheck.bench.variants import available_variants
    from paracheck.world import World

    sizes = _csv(args.sizes) or (("small",) if args.device == "cuda" else ("cpu",))
    try:
        models = [(s, model_for(s)) for s in sizes]
    except ValueError as exc:
        print(f"paracheck memory: {exc}", file=sys.stderr)
        return 2
    args.variants = _csv(args.variants)
    error = _usage_error(args, "memory")
    if error is not None:
        print(f"paracheck memory: {error}", file=sys.stderr)
        return 2
    variants = available_variants(args.variants or None, include_local=True)
    cuda = args.device == "cuda"
    record = {"machine": machine_info(args.device), "memory": []}
    with World(args.world_size, backend="nccl" if cuda else "gloo", timeout=args.timeout) as world:
        for size, model in models:
            rows = []
            for v in variants:
                w = 1 if v == "local" else args.world_size
                spec = StepSpec(
                    v,
                    model,
                    world_size=w,
                    batch=args.batch,
                    bucket_mb=args.bucket_mb,
                    warmup=1,
                    steps=1,
                )
                a = account_step(world, spec, timeout=args.timeout)
                entry = a.to_dict()
                row = [
                    v,
                    mib(a.param_bytes),
                    mib(a.grad_bytes),
                    mib(a.optimizer_state_bytes),
                    mib(a.peak_init_bytes),
                    mib(a.peak_before_step_bytes),
                    mib(a.peak_step_bytes),
                    mib(a.checkpoint_save_bytes),
                    mib(a.checkpoint_load_bytes),
                    mib(a.peak_load_bytes),
                    a.collectives,
                    mib(a.payload_bytes),
                    mib(a.bus_bytes),
                    a.operators,
                    a.launches,
                    a.allocations,
                    a.hooks,
                ]
                if cuda:
                    t = time_step(world, spec, timeout=args.timeout)
                    entry["cuda_memory"] = t.cuda_memory
                    row += [mib(t.cuda_memory[k]) for k in ("init", "before_step", "after_step")]
                record["memory"].append(entry)
                rows.append(row)
            header = [
                "variant",
                "params MiB",
                "grads MiB",
                "opt state MiB",
                "peak init MiB",
                "peak fwd/bwd MiB",
                "peak step MiB",
                "save writes MiB",
                "load reads MiB",
                "peak load MiB",
                "collectives/step",
                "payload MiB/step",
                "bus MiB/step",
                "operators/step",
                "launches/step",
                "allocations/step",
                "hook calls/step",
            ]
            if cuda:
                header += ["CUDA init MiB", "CUDA before step MiB", "CUDA after step MiB"]
            say(
                f"\n### exact memory, traffic and host cost per rank: {size}, {args.world_size} ranks, batch {args.batch}\n"
            )
            say(bench_table(header, rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    return 0
