"""``paracheck gate``: its options, and the verdict printed (Note [The gate rule] in
``paracheck.gate``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

__all__ = ["add_parser", "cmd_gate"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``gate`` to the subcommands ``sub``."""
    import paracheck.gate

    p = sub.add_parser(
        "gate",
        help="compare two commits' speed and memory; exit 1 on a regression",
        description=paracheck.gate.__doc__.split("\n\n")[0].replace("``", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Rule: exact quantities fail on any increase; a step time fails when, in two "
        "passes of interleaved rounds (the second with fresh processes), the median "
        "of the paired head/base ratios exceeds 1+threshold. Exit 1 on a regression, 0 otherwise, 2 when the gate "
        "cannot measure.",
    )
    p.add_argument(
        "targets",
        nargs="*",
        metavar="TARGET",
        help="import paths package.module:Class of the repository's DDP wrappers, sharded optimizers or "
        "ZeRO classes, measured at both commits with the installed paracheck (default: none, which "
        "in paracheck's own repository measures its built-in variants with each commit's paracheck)",
    )
    p.add_argument(
        "--base", required=True, help="the commit to compare against (any git revision; required)"
    )
    p.add_argument("--head", default="HEAD", help="the commit under test (default HEAD)")
    p.add_argument(
        "--repo", default=".", help="the git repository (default: the current directory)"
    )
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="gloo on CPU or NCCL on GPUs (default cpu)",
    )
    p.add_argument("--world-size", type=int, default=2, help="ranks per job (default 2)")
    p.add_argument(
        "--variants",
        default=None,
        help="comma-separated built-in variants, without TARGETs (default: all on both sides)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=6,
        help="interleaved rounds of the first pass, rounded up to even (default 6)",
    )
    p.add_argument(
        "--confirm-rounds",
        type=int,
        default=None,
        help="rounds of the second pass, which re-measures only the suspects (default 2 x rounds)",
    )
    p.add_argument(
        "--threshold", type=float, default=0.10, help="relative step-time threshold (default 0.10)"
    )
    p.add_argument(
        "--thresholds",
        default=None,
        metavar="PATH",
        help="per-variant thresholds measured by --calibrate on this machine with these settings; "
        "a variant the file does not name is judged at --threshold (default: none, --threshold for "
        "every variant)",
    )
    p.add_argument(
        "--calibrate",
        type=int,
        default=None,
        metavar="N",
        help="instead of gating, run the gate's two passes N times on --base against itself (fresh "
        "workers each) and write to --thresholds PATH each variant's threshold: the smallest that "
        "keeps false alarms within --alarm-rate by the noise measured (default: no calibration)",
    )
    p.add_argument(
        "--floor",
        type=float,
        default=0.02,
        help="with --calibrate: the smallest threshold written for a variant (default 0.02)",
    )
    p.add_argument(
        "--alarm-rate",
        type=float,
        default=1 / 30,
        help="with --calibrate: the false alarms per gate run the thresholds allow, over all "
        "variants (default 1/30)",
    )
    p.add_argument("--steps", type=int, default=8, help="timed steps per job (default 8)")
    p.add_argument(
        "--timing",
        choices=("wall", "cpu"),
        default="wall",
        help="what a step's time is: wall time, which sees blocking and CPU-bound slowdowns (default), "
        "or the ranks' CPU time, which sees CPU-bound ones only",
    )
    p.add_argument(
        "--model",
        default=None,
        help="LM workload of the suites (default: 'gate' on cpu, 'small' on cuda)",
    )
    p.add_argument(
        "--bucket-mb",
        type=float,
        default=None,
        help="bucket size in MB (default 1 on cpu, 25 on cuda)",
    )
    p.add_argument(
        "--timeout", type=float, default=300.0, help="seconds one job may take (default 300)"
    )
    p.add_argument(
        "--json",
        dest="json_path",
        default=None,
        help="also write the verdict and every reading as JSON to this path (default: none)",
    )
    p.add_argument(
        "--verbose",
        action="store_true",
        help="show every exact quantity, not only changed ones (default off)",
    )
    p.set_defaults(run=cmd_gate)


def _write_json(path: str | None, record: dict) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(record, f, indent=1)


def _thresholds(cfg) -> str:
    if not cfg.thresholds:
        return f"{cfg.threshold:.0%}"
    return "measured per variant, " + ", ".join(f"{v} {t:.1%}" for v, t in cfg.thresholds.items())


def _calibrate(cfg, n: int, floor: float, alarm_rate: float, path: str, t0: float) -> int:
    """``--calibrate N``: measure, write ``path``, print each variant's threshold."""
    from paracheck.gate import GateError, calibrate_gate

    try:
        record = calibrate_gate(cfg, n, floor, alarm_rate)
    except GateError as exc:
        print(f"paracheck gate: cannot calibrate: {exc}", file=sys.stderr)
        return 2
    _write_json(path, record)
    print(
        "| variant | A/A runs | pass 1 ratios, lowest / highest | pass 2 ratios, lowest / highest | threshold |"
    )
    print("| --- | ---: | --- | --- | ---: |")
    for v, d in record["variants"].items():
        a, b = d["first_pass"], d["second_pass"]
        mark = "" if d["reached"] else " (largest deviation seen: more runs needed for the rate)"
        print(
            f"| {v} | {len(a)} | x{min(a):.3f} / x{max(a):.3f} | x{min(b):.3f} / x{max(b):.3f} "
            f"| {d['threshold']:.1%}{mark} |"
        )
    print(
        f"\nThresholds for at most {alarm_rate:.3g} false alarms per gate run over "
        f"{len(record['variants'])} variant(s) (Note [Thresholds from measured noise]); a slowdown "
        f"about the size of a variant's threshold is caught about half the time."
    )
    print(
        f"wrote {path} ({time.monotonic() - t0:.0f} s): pass it to paracheck gate --thresholds "
        f"with the same settings on this machine"
    )
    return 0


def cmd_gate(args) -> int:
    """``paracheck gate``: 0 when nothing regressed, 1 on a regression (table on stdout), 2 when
    the gate cannot measure."""
    from paracheck.gate import GateConfig, GateError, format_rows, read_thresholds, run_gate

    for name in ("world_size", "rounds", "steps", "confirm_rounds", "calibrate"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            print(
                f"paracheck gate: --{name.replace('_', '-')}={getattr(args, name)} must be >= 1",
                file=sys.stderr,
            )
            return 2
    if not args.threshold > 0:
        print(f"paracheck gate: --threshold={args.threshold} must be > 0", file=sys.stderr)
        return 2
    if args.bucket_mb is not None and not args.bucket_mb > 0:
        print(f"paracheck gate: --bucket-mb={args.bucket_mb} must be > 0", file=sys.stderr)
        return 2
    if args.device != "cuda":
        from paracheck.check.limits import world_size_error

        error = world_size_error("--world-size", str(args.world_size), (args.world_size,), None)
        if error is not None:
            print(f"paracheck gate: {error}", file=sys.stderr)
            return 2
    for t in args.targets:
        mod, _, attr = t.partition(":")
        if not mod or not attr:
            print(
                f"paracheck gate: TARGET={t!r} must be an import path package.module:Class",
                file=sys.stderr,
            )
            return 2
    if args.targets and args.variants:
        print(
            f"paracheck gate: --variants={args.variants!r} names built-in variants; with TARGETs "
            f"({' '.join(args.targets)}) the TARGETs are what is measured",
            file=sys.stderr,
        )
        return 2
    if args.calibrate is not None and not args.thresholds:
        print(
            f"paracheck gate: --calibrate={args.calibrate} writes its thresholds to "
            f"--thresholds PATH: name the file",
            file=sys.stderr,
        )
        return 2
    if not 0 < args.alarm_rate < 1:
        print(f"paracheck gate: --alarm-rate={args.alarm_rate} must be in (0, 1)", file=sys.stderr)
        return 2
    if not args.floor > 0:
        print(f"paracheck gate: --floor={args.floor} must be > 0", file=sys.stderr)
        return 2
    cuda = args.device == "cuda"
    cfg = GateConfig(
        repo=os.path.abspath(args.repo),
        base=args.base,
        head=args.head,
        targets=tuple(args.targets),
        device=args.device,
        world_size=args.world_size,
        variants=tuple(v.strip() for v in args.variants.split(",") if v.strip())
        if args.variants
        else None,
        rounds=args.rounds,
        confirm_rounds=args.confirm_rounds,
        threshold=args.threshold,
        steps=args.steps,
        bucket_mb=args.bucket_mb if args.bucket_mb is not None else (25.0 if cuda else 1.0),
        model=args.model or ("small" if cuda else "gate"),
        timeout=args.timeout,
        timing=args.timing,
        verbose=args.verbose,
        json_path=args.json_path,
    )
    t0 = time.monotonic()
    if args.calibrate is not None:
        return _calibrate(cfg, args.calibrate, args.floor, args.alarm_rate, args.thresholds, t0)
    try:
        if args.thresholds:
            cfg.thresholds = read_thresholds(args.thresholds, cfg)
        rows, record = run_gate(cfg)
    except GateError as exc:
        print(f"paracheck gate: cannot decide: {exc}", file=sys.stderr)
        _write_json(
            cfg.json_path,
            {
                "verdict": "ERROR",
                "exit_code": 2,
                "error": str(exc),
                "base": {"ref": cfg.base},
                "head": {"ref": cfg.head},
                "targets": list(cfg.targets),
                "seconds": time.monotonic() - t0,
            },
        )
        return 2
    failed = [r for r in rows if r.failed]
    print(format_rows(rows, verbose=cfg.verbose))
    unstable = [r for r in rows if r.verdict == "UNSTABLE"]
    if unstable:
        print(
            f"\nwarning: {len(unstable)} quantities are not reproducible on one side and were not gated"
        )
    print(
        f"\n{'REGRESSION' if failed else 'PASS'}: {len(failed)} of {len(rows)} quantities regressed "
        f"(threshold {_thresholds(cfg)} on step {cfg.timing} times, any increase on exact quantities; "
        f"{time.monotonic() - t0:.0f} s)"
    )
    record.update(
        verdict="REGRESSION" if failed else "PASS",
        exit_code=1 if failed else 0,
        regressions=[r.__dict__ for r in failed],
        seconds=time.monotonic() - t0,
    )
    _write_json(cfg.json_path, record)
    return 1 if failed else 0
