"""``paracheck check`` and ``paracheck selftest``: their options and what they run."""

from __future__ import annotations

import argparse
import json
import sys
import time

from paracheck.cli._check_options import (
    _writable,
    planned,
    refuse_lockstep,
)
from paracheck.cli._common import UsageError, ignore_signals, report_stop

__all__ = ["add_parsers", "cmd_check", "cmd_selftest", "refuse_lockstep"]


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add ``check`` and ``selftest`` to the subcommands ``sub``."""
    from paracheck.check.kinds import KINDS
    from paracheck.check.settings import CHECK, SELFTEST, add_arguments
    from paracheck.check.targets import targets_help

    c = sub.add_parser(
        "check",
        help="check targets against the single-process oracle",
        description="Check each TARGET against the single-process oracle on generated cases; "
        "exit 1 when a property fails, 2 on a usage error.",
        epilog=targets_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument(
        "targets",
        nargs="*",
        help="built-in name or package.module:Class (default: the main job, paracheck's own "
        "built-ins; --all: every built-in)",
    )
    add_arguments(c, CHECK, choices={"kind": list(KINDS)})
    s = sub.add_parser("selftest", help="run the check against every mutant and built-in target")
    add_arguments(s, SELFTEST)
    s.add_argument(
        "--only",
        nargs="*",
        default=None,
        help="restrict to these mutant/target names (default: all)",
    )
    s.add_argument(
        "--table",
        metavar="PATH",
        default=None,
        help="also write the mutants as a Markdown table (bug, killing property, examples, "
        "margin: error over tolerance) to PATH (default: none)",
    )
    c.set_defaults(run=cmd_check)
    s.set_defaults(run=cmd_selftest)


def _make_world(
    backend: str,
    size: int,
    timeout: float,
    rank_memory: float | None = None,
    attach: str | None = None,
    attach_timeout: float = 30.0,
):
    from paracheck.world import World

    if attach is not None:
        from paracheck.world.attached import AttachedWorld

        try:
            return AttachedWorld(attach, timeout=timeout, start_timeout=attach_timeout)
        except RuntimeError as exc:
            raise UsageError(str(exc).replace("attach=", "--attach=", 1)) from None

    if backend == "nccl":
        import torch

        n = torch.cuda.device_count()
        if size > n:
            raise UsageError(
                f"--world-sizes: world size {size} exceeds the {n} CUDA device(s) present (--backend nccl)"
            )
    return World(size, backend=backend, timeout=timeout, rank_memory=rank_memory)


def cmd_check(args) -> int:
    from paracheck.cli._check_summary import announce, opening

    t0 = time.monotonic()
    to_stdout = args.json == "-"
    job = opening(args)
    # Before torch is imported and any rank starts: a new user sees at once what is starting.
    announce(job.line, to_stdout)
    from paracheck.check.property import check_target

    plans, case, sizes = planned(args, job)
    targets = [p.target for p in plans]
    from paracheck.world import PoolLost

    failed = 0
    reports: list = []
    world = progress = stream = None
    lost: str | None = None  # Note [A lost pool]
    unchecked: list = []
    try:
        world = _make_world(
            args.backend,
            max(sizes),
            args.timeout,
            args.rank_memory,
            args.attach,
            args.attach_timeout,
        )
        started = time.monotonic() - t0  # torch imported, the targets read, the ranks started
        for i, (target, one) in enumerate(zip(targets, plans)):
            try:
                if case is not None:
                    from paracheck.check.report import case_report
                    from paracheck.check.run import run_case

                    stream = None
                    report = case_report(
                        target,
                        run_case(world, target, case, timeout=args.timeout),
                        timeout=args.timeout,
                        rank_memory=args.rank_memory,
                    )
                else:
                    from paracheck.check.property import Progress

                    progress = Progress()
                    stream = (
                        None if to_stdout else _Stream(target, args.backend, one.settings, progress)
                    )
                    if stream is not None:
                        stream.begin()
                    report = check_target(
                        target,
                        world,
                        one,
                        progress=progress,
                        on_failure=stream.failure if stream else None,
                        on_row=stream.row if stream else None,
                    )
                    report.timeout = args.timeout
                    report.rank_memory = args.rank_memory
                    report.incomplete_passes = args.incomplete == "pass"
            except PoolLost as exc:  # nothing found on this target before the agents were lost
                lost, unchecked = str(exc), targets[i:]
                break
            reports.append(report)
            failed += not report.passed
            if not to_stdout:
                # Streamed, the blocks and rows are printed already: the verdict line ends them.
                text = report.table_text(blocks=False, rows=False) if stream else None
                print(text or report.text(args.backend), flush=True)
            if getattr(world, "lost", None) is not None:  # Note [A lost pool]
                lost, unchecked = world.lost, targets[i + 1 :]
                break
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (cli._common.Terminated)
        _stop(world, progress)
        _report_stopped(exc, args, reports, targets, streamed=stream is not None)
        raise
    finally:
        if world is not None:
            world.close()
    from paracheck.cli._check_summary import summary_lines, verdict_of

    if args.json is not None:
        _write_json(args.json, reports, args.backend, len(targets))
    if lost is not None:
        names = ", ".join(t.name for t in unchecked)
        print(f"paracheck: {lost}" + (f" (not checked: {names})" if names else ""), file=sys.stderr)
        return 1 if failed else 2
    if len(targets) > 1 and not to_stdout:
        lines = summary_lines(reports, len(targets), time.monotonic() - t0, started)
        print("\n".join(lines), flush=True)
    return verdict_of(reports, len(targets))[1]


class _Stream:
    """Prints a check's verdict table as it fills: each new cause of failure the moment it is
    found (a block), each row as it ends (a line)."""

    def __init__(self, target, backend: str, settings, progress):
        self.target, self.backend, self.settings, self.progress = (
            target,
            backend,
            settings,
            progress,
        )
        self.failures: list = []
        self.started = False

    def begin(self) -> None:
        """The table's first line, as its search starts: what is searched while the first row
        runs (the first cases of a check cost the most: the oracle's first optimizer step)."""
        if not self.started:
            budget = self.settings.budget
            print(
                f"paracheck {self.target.name}: verdict table"
                + (f", budget {budget:g} s" if budget else ""),
                flush=True,
            )
            self.started = True

    def _print(self, text: str) -> None:
        self.progress.clear()
        self.begin()
        print(text, flush=True)

    def failure(self, failure) -> None:
        from paracheck.check.verdict import cause_text, causes_of

        self.failures.append(failure)
        groups = causes_of(self.failures)
        n = next(i for i, g in enumerate(groups) if any(f is failure for f in g)) + 1
        if len(groups[n - 1]) > 1:
            where = f" in row {failure.row}" if failure.row else ""
            self._print(f"  {failure.property}{where}: cause {n} again")
            return
        self._print(
            cause_text(
                [failure],
                n,
                self.target,
                self.backend,
                timeout=self.settings.timeout,
                rank_memory=self.settings.rank_memory,
                case_files=self.settings.example_database is not None,
            )
        )

    def row(self, row, index: int, total: int) -> None:
        from paracheck.check.report import BEYOND_HEADING
        from paracheck.check.verdict import causes_of

        groups = causes_of(self.failures)
        number = {id(f): i + 1 for i, g in enumerate(groups) for f in g}
        width = max(len("+" + n) for n in _row_names())
        if row.beyond and not getattr(self, "beyond_said", False):
            self.beyond_said = True  # the rows beyond the target's contract come last
            self._print(f"  {BEYOND_HEADING}")
        self._print(f"  [{index + 1}/{total}] " + row.line(width, number))


def _row_names():
    from paracheck.check.features import PAIRS, optional_features

    return ("core", "all features", *optional_features(), *("+".join(p) for p in PAIRS))


def _write_json(path: str, reports, backend: str, total: int | None = None) -> None:
    from paracheck.cli._check_summary import verdict_of

    line, _ = verdict_of(reports, len(reports) if total is None else total)
    data = {
        "passed": all(r.passed for r in reports),
        "verdict": line.split(":", 1)[0],
        "verdict_line": line,
        "backend": backend,
        "targets": [r.to_dict(backend) for r in reports],
    }
    text = json.dumps(data, indent=2)
    if path == "-":
        print(text, flush=True)
        return
    with open(path, "w") as f:
        f.write(text + "\n")


def _report_stopped(exc, args, reports: list, targets: list, *, streamed: bool) -> None:
    """After Ctrl-C or SIGTERM: what the stopped check found (every failure, with the rows it
    reached) and the verdicts of the targets that finished."""
    partial = getattr(exc, "report", None)
    if partial is not None:
        partial.timeout, partial.rank_memory = args.timeout, args.rank_memory
        if args.json != "-":
            print(partial.table_text(args.backend, blocks=not streamed), flush=True)
        if args.json is not None:
            _write_json(args.json, [*reports, partial], args.backend)
    noun = "target" if len(targets) == 1 else "targets"
    report_stop(
        exc,
        [r.summary() for r in reports],
        f"of {len(targets)} {noun}",
        None if partial is None else partial.summary(),
    )


def _stop(world, progress) -> None:
    """After Ctrl-C or SIGTERM: end the ranks at once (they may be inside a job, which a graceful
    close would wait for) and clear the progress line, with further signals ignored."""
    ignore_signals()
    if progress is not None:
        progress.clear()
    if world is not None:
        world.kill()


def cmd_selftest(args) -> int:
    from paracheck.check.plan import InvalidArgument, settled, world_sizes
    from paracheck.check.settings import SELFTEST, from_namespace
    from paracheck.selftest import markdown_table, row_line, run_selftest

    refuse_lockstep(None)
    try:  # the selftest's options, settled as a check's are (Note [One plan per check])
        sizes = world_sizes(settled(from_namespace(args, SELFTEST)))
    except InvalidArgument as exc:
        raise UsageError(exc.text("--")) from None
    _writable("--table", args.table)
    if args.only is not None:
        from paracheck.check.targets import BUILTIN_TARGETS
        from paracheck.mutants import MUTANTS

        unknown = [n for n in args.only if n not in BUILTIN_TARGETS and n not in MUTANTS]
        if unknown or not args.only:
            raise UsageError(
                f"--only={' '.join(args.only)!r}: "
                + (f"unknown {unknown}" if unknown else "give at least one name")
                + f"; the built-in targets are {', '.join(BUILTIN_TARGETS)}, and the mutants "
                f"those of `paracheck selftest` ({len(MUTANTS)})"
            )
    rows: list[dict] = []
    world = None
    try:
        world = _make_world(args.backend, max(sizes), args.timeout)
        return run_selftest(
            profile=args.profile,
            only=args.only,
            world_sizes=sizes,
            timeout=args.timeout,
            world=world,
            dtype=args.dtype,
            rows=rows,
        )
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (cli._common.Terminated)
        _stop(world, None)
        report_stop(exc, [row_line(r) for r in rows], "check" if len(rows) == 1 else "checks")
        raise
    finally:
        if args.table is not None and rows:
            with open(args.table, "w", encoding="utf-8") as f:
                f.write(markdown_table(rows, args.dtype))
        if world is not None:
            world.close()
