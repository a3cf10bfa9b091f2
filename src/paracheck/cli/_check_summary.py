"""What ``paracheck check`` says before and after its targets: the first line (what is starting,
printed before torch is imported or a rank starts), the main job's choice of targets and
examples, and the summary of every target with the one verdict line that ends the command.

Note [The main job]
    ``paracheck check`` with no TARGET is the first command a new user runs, and it must answer
    within minutes on a laptop: it checks paracheck's own built-ins (``main_job_targets``: not
    torch's DistributedDataParallel, ZeroRedundancyOptimizer and FSDP2, which only check torch
    through their adapters; torch's FSDP2 alone cost 89 s) with ``MAIN_JOB_EXAMPLES`` examples per
    search (the ci profile's 40 in the core and all-features rows, 10 in each feature row, became
    10 and 5), in one pool of ranks shared by every target. Every row of every table is still
    searched and judged as any check's is (its count of cases says how many); the first line says
    what the main job covers, and ``--all`` checks every built-in at the profile's examples, as
    before. A given ``--max-examples`` or ``--profile`` other than ci applies as given.

    On gloo the main job draws world sizes 1, 2 and 3 (``MAIN_JOB_WORLD_SIZES``), not 4: four
    ranks on two cores cost a tenth of its time, and the bugs of the mutant catalogue need at
    most three ranks (docs/measurements.md: at world sizes 1 and 2 every mutant but the one that
    needs three was killed); a given ``--world-sizes`` applies as given. Measured on the 2-core
    machine under other work (2026-12-07): 407 s of CPU for the 15 built-ins before, 170 s for
    the main job at world sizes 1-4, 138 s at 1-3 (3 min 30 s of wall time under that load).

    The main job leaves compiled cases out (``MAIN_JOB_FEATURES``): each compiles its graphs on
    every rank (about 1 s a case), and the compile row with the compiled cases of the
    all-features row took 40 of its 154 s on two quiet cores (2026-12-07). Its compile row says
    ``not drawn: --features -compile``; ``--all``, ``--features +compile`` or a named target
    draws them, and paracheck's tests check every built-in DDP compiled. It leaves out the two
    built-ins that are another with float32 master weights too (``MAIN_JOB_VARIANTS``: 12-13 s
    each); without both, the main job took 2 min 5 s there, with them 2 min 35 s.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from paracheck.cli._common import UsageError

__all__ = [
    "MAIN_JOB_EXAMPLES",
    "MAIN_JOB_FEATURES",
    "MAIN_JOB_VARIANTS",
    "MAIN_JOB_WORLD_SIZES",
    "Opening",
    "first_line",
    "main_job_targets",
    "main_job_world_sizes",
    "opening",
    "peers",
    "summary_lines",
    "verdict_of",
]

# Examples per search, world sizes and features left out of the main job on gloo (Note [The main
# job]).
MAIN_JOB_EXAMPLES = 10
MAIN_JOB_WORLD_SIZES = "1,2,3"
MAIN_JOB_FEATURES = ("compile",)
# Built-ins that are another built-in with float32 master weights: checked by --all, by name and by
# the tests, not by the main job (Note [The main job]).
MAIN_JOB_VARIANTS = ("sharded-master", "zero1-master")
_LEFT_OUT = {f"-{name}" for name in MAIN_JOB_FEATURES}


def peers() -> tuple[str, ...]:
    """The built-ins that are torch's own implementations, checked through adapters."""
    from paracheck.check.targets import BUILTIN_TARGETS

    return tuple(n for n in BUILTIN_TARGETS if n.startswith("torch-"))


@dataclass(frozen=True)
class Opening:
    """What ``paracheck check`` decides from its command line before anything is read: the main
    job's built-ins (None: not the main job), the command's first line, and the main job's own
    settings where the command line gives none (``world_sizes``, ``max_examples``,
    ``features``)."""

    main_job: list[str] | None
    line: str
    changes: dict[str, object]


def opening(args) -> Opening:
    """The ``Opening`` of a check's command line (Note [The main job])."""
    names = main_job_targets(args)
    changes: dict[str, object] = {}
    if names is not None:
        given = {
            "world_sizes": main_job_world_sizes(args),
            "max_examples": main_job_examples(args),
            "features": main_job_features(args),
        }
        changes = {name: value for name, value in given.items() if value is not None}
    return Opening(names, first_line(args, names), changes)


def main_job_targets(args) -> list[str] | None:
    """The built-in names the main job checks (None: not the main job, TARGETs or ``--adapters``
    or ``--case`` given); ``--all`` outside the main job is a usage error."""
    from paracheck.check.targets import BUILTIN_TARGETS

    main = not args.targets and args.adapters is None and args.case is None
    if args.all and not main:
        given = (
            f"TARGET {' '.join(args.targets)}"
            if args.targets
            else ("--adapters" if args.adapters is not None else "--case")
        )
        raise UsageError(
            f"--all checks every built-in and takes no TARGET, --adapters or --case (given: "
            f"{given})"
        )
    if not main:
        return None
    names = list(BUILTIN_TARGETS)
    return names if args.all else [n for n in names if n not in (*peers(), *MAIN_JOB_VARIANTS)]


def main_job_examples(args) -> int | None:
    """The examples per search the main job runs where none is given (None: the profile's)."""
    if args.all or args.max_examples is not None or args.profile != "ci":
        return None
    return MAIN_JOB_EXAMPLES


def main_job_features(args) -> str | None:
    """The ``--features`` the main job runs with (None: as given): ``MAIN_JOB_FEATURES`` left
    out, unless ``--all`` or a ``--features`` naming one of them."""
    if args.all:
        return None
    given = args.features or ""
    named = {item.strip()[1:] for item in given.split(",") if item.strip()}
    off = [f"-{name}" for name in MAIN_JOB_FEATURES if name not in named]
    return ",".join([*off, given] if given else off) or None


def main_job_world_sizes(args) -> str | None:
    """The world sizes the main job draws where none are given (None: the check's default)."""
    if args.all or args.world_sizes is not None or args.attach is not None:
        return None
    if args.backend not in (None, "gloo"):
        return None
    return MAIN_JOB_WORLD_SIZES


def first_line(args, names: list[str] | None) -> str:
    """The command's first line: what it checks and that the ranks are starting."""
    backend = args.backend or ("the agents' backend" if args.attach else "gloo")
    where = f"starting the ranks ({backend})" if not args.attach else f"attaching to {args.attach}"
    if names is None:
        n = len(args.targets) + (args.adapters is not None)
        what = ", ".join(args.targets + ([f"--adapters {args.adapters}"] if args.adapters else []))
        if not what:
            what = "every built-in"
        return f"paracheck check: {what}{' (the given case)' if args.case else ''}; " + (
            f"loading {'it' if n == 1 else 'them'} and {where}"
        )
    examples = main_job_examples(args)
    from paracheck.check.settings import PROFILES

    per = examples or args.max_examples or PROFILES[args.profile]["max_examples"]
    if args.all:
        return f"paracheck check: every built-in ({len(names)}), {per} examples per search; {where}"
    left = peers()
    sizes = main_job_world_sizes(args)
    at = f", world sizes {sizes}" if sizes else ""
    off = [i[1:] for i in (main_job_features(args) or "").split(",") if i in _LEFT_OUT]
    without = f", features {', '.join(off)} left out" if off else ""
    return (
        f"paracheck check: the main job: paracheck's {len(names)} built-ins, {per} examples per "
        f"search{at}{without} (torch's {', '.join(left)} and the master-weight variants "
        f"{', '.join(MAIN_JOB_VARIANTS)} left out; --all checks all "
        f"{len(names) + len(left) + len(MAIN_JOB_VARIANTS)} at the profile's examples and world "
        f"sizes 1-4, every feature); {where}"
    )


def announce(text: str, to_stdout: bool) -> None:
    """Print the first line at once: on stdout, or on stderr where stdout is the JSON verdict."""
    print(text, file=sys.stderr if to_stdout else sys.stdout, flush=True)


def verdict_of(reports: list, total: int) -> tuple[str, int]:
    """The one line that ends a check of ``total`` targets, and its exit status: FAIL (1) where
    a target failed, INCOMPLETE (3) where one left rows not reached, else PASS (0)."""
    noun = "target" if total == 1 else "targets"
    failed = [r.target.name for r in reports if r.verdict == "FAIL"]
    incomplete = [r for r in reports if r.verdict == "INCOMPLETE"]
    short = [f"{r.target.name}: {r.not_reached} not reached" for r in incomplete]
    if failed:
        line = f"FAIL: {len(failed)} of {total} {noun} ({', '.join(failed)})"
        if incomplete:
            line += f"; INCOMPLETE: {len(incomplete)} ({', '.join(short)})"
        return line, 1
    if incomplete:
        return (
            f"INCOMPLETE: {len(incomplete)} of {total} {noun} with rows not reached "
            f"({', '.join(short)}), {total - len(incomplete)} PASS; give them more time "
            "(--budget SECONDS, 0: no limit) or accept the rows reached (--incomplete pass)",
            3,
        )
    accepted = sum(1 for r in reports if r.not_reached)
    tail = f" ({accepted} with rows not reached: --incomplete pass)" if accepted else ""
    return f"PASS: {len(reports)} of {total} {noun}{tail}", 0


def summary_lines(
    reports: list, total: int, seconds: float, started: float | None = None
) -> list[str]:
    """A row per target (its verdict, its rows passed, failed and not reached, its seconds),
    then the verdict line (``verdict_of``); ``started``: the seconds before the first target
    (loading torch and the targets, starting the ranks)."""
    width = max([len("target")] + [len(r.target.name) for r in reports])
    noun = "target" if total == 1 else "targets"
    start = "" if started is None else f" ({started:.1f} s of them starting the ranks)"
    out = [
        f"summary of {len(reports)} {noun} in {seconds:.1f} s{start}:",
        f"  {'target':<{width}}  {'verdict':<10}  rows PASS/FAIL/not reached  seconds",
    ]
    for r in reports:
        if r.rows:
            count = {s: sum(1 for row in r.rows if row.status == s) for s in ("PASS", "FAIL")}
            rows = f"{count['PASS']}/{count['FAIL']}/{r.not_reached}"
        else:
            rows = "- (one case)"
        out.append(f"  {r.target.name:<{width}}  {r.verdict:<10}  {rows:<26}  {r.seconds:.1f}")
    out.append(verdict_of(reports, total)[0])
    return out
