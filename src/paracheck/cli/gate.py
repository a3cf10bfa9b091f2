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
        epilog="Rule: exact quantities fail on any increase; interleaved rounds of head and base go on "
        "until a confidence interval on the median head/base step-time ratio lies wholly above "
        "1+threshold (FAIL) or below it (PASS), or the budget (--rounds, --seconds) ends "
        "(INCONCLUSIVE). Exit 0 PASS, 1 FAIL, 2 the gate cannot measure, 3 INCONCLUSIVE (see "
        "--inconclusive).",
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
    _add_budget_arguments(p)
    _add_output_arguments(p)
    p.set_defaults(run=cmd_gate)


def _add_budget_arguments(p: argparse.ArgumentParser) -> None:
    """What is measured and how long the rounds may go on: variants, rounds, the thresholds."""
    from paracheck.gate.rule import DEFAULT_ROUNDS

    p.add_argument(
        "--variants",
        default=None,
        help="comma-separated built-in variants, without TARGETs (default: all on both sides)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=DEFAULT_ROUNDS,
        help="budget: the most interleaved rounds per variant, rounded up to even; a timing "
        f"needs at least 14 to be decided (default {DEFAULT_ROUNDS})",
    )
    p.add_argument(
        "--seconds",
        type=float,
        default=600.0,
        help="budget: seconds the rounds may take, checked after every second round (default 600)",
    )
    p.add_argument(
        "--fresh-every",
        type=int,
        default=10,
        help="restart the workers and ranks every this many rounds (default 10)",
    )
    p.add_argument(
        "--threshold",
        type=float,
        default=0.10,
        help="relative step-time threshold: FAIL when the median ratio is shown above 1+threshold, "
        "PASS when shown below (default 0.10)",
    )
    p.add_argument(
        "--error-rate",
        type=float,
        default=None,
        help="the chance of a wrong FAIL, and of a wrong PASS, per gate run at a median ratio on "
        "the threshold, shared by the variants (default 0.001)",
    )
    p.add_argument(
        "--inconclusive",
        choices=("exit3", "fail", "pass"),
        default="exit3",
        help="what an INCONCLUSIVE verdict does: exit 3 (default), exit 1 as a FAIL, or exit 0 as "
        "a PASS",
    )


def _add_output_arguments(p: argparse.ArgumentParser) -> None:
    """Where the readings go, and how one job is run and timed."""
    p.add_argument(
        "--history",
        default=None,
        metavar="DIR",
        help="record both commits' readings into this history, which paracheck report shows "
        "(default: .paracheck/history in the repository, git-ignored)",
    )
    p.add_argument("--no-history", action="store_true", help="record nothing (default: record)")
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
        help="show every exact quantity, not only changed ones, and beside each step time the "
        "ratio of the fastest jobs, which is reported, not judged (default off)",
    )


def _write_json(path: str | None, record: dict) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(record, f, indent=1)


def _verdict(rows) -> str:
    """FAIL when anything regressed, else INCONCLUSIVE when a timing is undecided, else PASS."""
    if any(r.failed for r in rows):
        return "FAIL"
    return "INCONCLUSIVE" if any(r.verdict == "INCONCLUSIVE" for r in rows) else "PASS"


EXIT = {"PASS": 0, "FAIL": 1, "INCONCLUSIVE": 3}


# The exact error of the sequential plan (Note [Sequential sign test]) costs the square of the
# budget: 400 rounds take seconds to plan, and at seconds per round far more than a gate needs.
MAX_ROUNDS = 400


def _usage_error(args, error_rate: float) -> str | None:
    """What is wrong with the options (the message after ``paracheck gate: ``), or None."""
    for name in ("world_size", "rounds", "steps", "fresh_every"):
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')}={getattr(args, name)} must be >= 1"
    if args.rounds > MAX_ROUNDS:
        return f"--rounds={args.rounds} must be <= {MAX_ROUNDS}"
    for name in ("threshold", "seconds", "timeout"):
        if not getattr(args, name) > 0:
            return f"--{name}={getattr(args, name)} must be > 0"
    if args.model is not None:
        from paracheck.bench.suites import model_for

        try:
            model_for(args.model)
        except ValueError as exc:  # "model='x' must be one of [...]"
            return f"--{exc}"
    if not 0 < error_rate < 0.5:
        return f"--error-rate={error_rate} must be in (0, 0.5)"
    if args.bucket_mb is not None and not args.bucket_mb > 0:
        return f"--bucket-mb={args.bucket_mb} must be > 0"
    if args.device != "cuda":
        from paracheck.check.limits import world_size_error

        error = world_size_error("--world-size", str(args.world_size), (args.world_size,), None)
        if error is not None:
            return error
    for t in args.targets:
        mod, _, attr = t.partition(":")
        if not mod or not attr:
            return f"TARGET={t!r} must be an import path package.module:Class"
    if args.targets and args.variants:
        return (
            f"--variants={args.variants!r} names built-in variants; with TARGETs "
            f"({' '.join(args.targets)}) the TARGETs are what is measured"
        )
    return _path_error(args)


def _path_error(args) -> str | None:
    """What is wrong with the repository, the refs and the output paths, or None: found before
    any worker starts, not after minutes of rounds."""
    import subprocess

    if not os.path.isdir(args.repo):
        return f"--repo={args.repo!r} is not a directory"
    inside = subprocess.run(
        ["git", "-C", args.repo, "rev-parse", "--git-dir"], capture_output=True, text=True
    )
    if inside.returncode != 0:
        return f"--repo={args.repo!r} is not a git repository"
    for name in ("base", "head"):
        ref = getattr(args, name)
        found = subprocess.run(
            ["git", "-C", args.repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
            capture_output=True,
            text=True,
        )
        if found.returncode != 0:
            return f"--{name}={ref!r} is not a commit of {os.path.abspath(args.repo)}"
    if args.json_path is not None:
        parent = os.path.dirname(os.path.abspath(args.json_path))
        if os.path.isdir(args.json_path):
            return f"--json={args.json_path!r} is a directory, not a file to write"
        if not os.path.isdir(parent):
            return f"--json={args.json_path!r} cannot be written: {parent} is not a directory"
    if args.history is not None and os.path.exists(args.history):
        if not os.path.isdir(args.history):
            return f"--history={args.history!r} is not a directory"
    return None


def _config(args, error_rate: float):
    """The ``GateConfig`` of the options, with the device's defaults."""
    from paracheck.gate import GateConfig

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
        seconds=args.seconds,
        fresh_every=args.fresh_every,
        error_rate=error_rate,
        threshold=args.threshold,
        steps=args.steps,
        bucket_mb=args.bucket_mb if args.bucket_mb is not None else (25.0 if cuda else 1.0),
        model=args.model or ("small" if cuda else "gate"),
        timeout=args.timeout,
        timing=args.timing,
        verbose=args.verbose,
        json_path=args.json_path,
    )
    return cfg


def cmd_gate(args) -> int:
    """``paracheck gate``: 0 PASS, 1 FAIL (table on stdout), 2 when the gate cannot measure, 3
    INCONCLUSIVE (unless ``--inconclusive`` maps it to 0 or 1)."""
    from paracheck.gate import (
        DEFAULT_ROUNDS,
        ERROR_RATE,
        GateError,
        format_rows,
        run_gate,
    )
    from paracheck.gate.rule import sequential_plan

    error_rate = ERROR_RATE if args.error_rate is None else args.error_rate
    error = _usage_error(args, error_rate)
    if error is not None:
        print(f"paracheck gate: {error}", file=sys.stderr)
        return 2
    cfg = _config(args, error_rate)
    if sequential_plan(cfg.rounds + cfg.rounds % 2, error_rate).first_look is None:
        print(
            f"paracheck gate: warning: --rounds={args.rounds} cannot decide a step time at "
            f"--error-rate={error_rate:g} (with --rounds {DEFAULT_ROUNDS}, one variant can be "
            f"decided after {sequential_plan(DEFAULT_ROUNDS, error_rate).first_look}): timings "
            f"will be INCONCLUSIVE, exact "
            f"quantities still decide",
            file=sys.stderr,
        )
    t0 = time.monotonic()
    try:
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
    undecided = [r for r in rows if r.verdict == "INCONCLUSIVE"]
    print(format_rows(rows, verbose=cfg.verbose))
    unstable = [r for r in rows if r.verdict == "UNSTABLE"]
    if unstable:
        print(
            f"\nwarning: {len(unstable)} quantities are not reproducible on one side and were not gated"
        )
    verdict = _verdict(rows)
    code = EXIT[verdict]
    if verdict == "INCONCLUSIVE" and args.inconclusive != "exit3":
        code = EXIT[args.inconclusive.upper()]
    seconds = time.monotonic() - t0
    print(
        f"\n{verdict}: {len(failed)} of {len(rows)} quantities regressed, {len(undecided)} step "
        f"time(s) undecided (threshold {cfg.threshold:.0%} on step {cfg.timing} times, at most "
        f"{error_rate:g} wrong verdicts per direction; any increase on exact quantities; "
        f"{seconds:.0f} s)"
    )
    if verdict == "INCONCLUSIVE":
        print(
            "The noise did not let the rounds show the median ratio on either side of the "
            "threshold within the budget (the detail column gives each interval and spread): "
            "rerun on a quieter machine, or give more --rounds / --seconds"
            + ("" if code == 3 else f"; --inconclusive={args.inconclusive}: exit {code}")
        )
    record.update(
        verdict=verdict,
        exit_code=code,
        regressions=[r.__dict__ for r in failed],
        inconclusive=[r.__dict__ for r in undecided],
        seconds=seconds,
    )
    _write_json(cfg.json_path, record)
    if not args.no_history:
        from paracheck.report.store import default_history, record_gate

        where = record_gate(args.history or default_history(cfg.repo), cfg.repo, record)
        print(f"recorded both commits in {where}: `paracheck report --serve` shows them")
    return code
