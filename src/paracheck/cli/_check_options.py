"""What only ``paracheck check``'s command line checks before anything runs: the targets' kind and
properties, the case it reads, the flags that disagree, the output paths. Each refuses bad input
with a ``UsageError`` naming the option and its value; the rest of the options are settled by
``paracheck.check.plan`` (Note [One plan per check])."""

from __future__ import annotations

import os
import sys

from paracheck.cli._common import UsageError


def _positive(name: str, value, kind=int):
    if value is None:
        return None
    if not value > 0:
        raise UsageError(f"{name}={value!r} must be > 0")
    return value


def _chosen(args, targets: list) -> list:
    """``targets`` checked against ``--kind`` and narrowed to ``--properties``."""
    if args.kind is not None:
        from paracheck.check.interfaces import kind_mismatch

        for t in targets:
            why = kind_mismatch(t)
            if why is not None:
                raise UsageError(f"--kind={args.kind} does not fit {t.name}: {why}")
    if not targets:  # --adapters whose every design is a stub (listed above)
        raise UsageError(
            f"--adapters={args.adapters!r}: no design is implemented (every adapter function "
            f"only raises NotImplementedError): nothing to check"
        )
    if args.properties is not None:
        from paracheck.check.kinds import select_properties

        chosen = [p.strip() for p in args.properties.split(",") if p.strip()]
        try:
            targets, warnings = select_properties(targets, chosen)
        except ValueError as exc:
            raise UsageError(f"--properties={args.properties!r}: {exc}") from None
        for warning in warnings:
            print(f"paracheck: warning: {warning}", file=sys.stderr)
    return targets


def _case(args):
    """The ``--case`` to run, read from its JSON or the file holding it (None: draw cases)."""
    if args.case is not None and not args.case.strip():
        # An empty $(cat missing.json) would otherwise run the whole search.
        raise UsageError(f"--case={args.case!r}: not a case (give the JSON a failure printed)")
    if not args.case:
        return None
    from paracheck.cases import Case

    text = args.case
    if not text.lstrip().startswith("{") and os.path.isfile(text):
        with open(text, encoding="utf-8") as f:
            text = f.read()
    try:
        return Case.from_json(text)
    except Exception as exc:  # noqa: BLE001
        raise UsageError(f"--case is not a valid case: {type(exc).__name__}: {exc}") from None


def _check_flags(args) -> None:
    """What only the command line can get wrong: ``--dtype`` and ``--precision`` that disagree
    (elsewhere ``precision`` replaces ``dtype``), a ``--json`` path whose verdict would be lost."""
    from paracheck.check.plan import DTYPE_PRECISIONS

    if args.precision is not None and args.dtype is not None:
        if DTYPE_PRECISIONS[args.dtype] != args.precision:
            raise UsageError(
                f"--dtype={args.dtype} and --precision={args.precision} disagree: "
                "give --precision only"
            )
    if args.json not in (None, "-"):
        _writable("--json", args.json)


def _without_refused_loops(args, plans) -> list:
    """``plans`` without the loops that apply their own precision where another is given
    (``CheckPlan.refused``): a usage error where such a loop is named, else a note."""
    refused = {p.target.name: p.refused for p in plans if p.refused is not None}
    if refused:
        given = next(p.settings.precision for p in plans if p.refused is not None)
        named = [name for name in refused if name in (args.targets or ())]
        if named:
            raise UsageError(f"{named[0]}: --precision={given}: {refused[named[0]]}")
        print(
            f"paracheck: note: --precision={given}: the loop targets "
            f"{', '.join(refused)} are not checked (a loop applies autocast and loss scaling "
            "itself)",
            file=sys.stderr,
        )
    return [p for p in plans if p.refused is None]


def _check_case_fits(args, case, targets: list) -> None:
    """Refuse a ``--case`` that is not a case of a target by its declarations."""
    from paracheck.check.property import declared_mismatch

    for t in targets:
        why = declared_mismatch(case, t)
        if why:
            raise UsageError(
                f"--case is not a case of {t.name}: {why} (give the options the case was "
                f"found with: --loss, --clip-norm)"
            )
    if args.features is not None or args.contract != "full":
        print(
            "paracheck: warning: --contract/--features are ignored with --case (it runs as given)",
            file=sys.stderr,
        )


def _writable(option: str, path: str | None) -> None:
    """Refuse, before anything runs, an output path whose results would be lost at the end: a
    folder, or a file in a folder that does not exist."""
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise UsageError(f"{option}={path!r} is a folder: give a file to write")
    if not os.path.isdir(folder):
        raise UsageError(f"{option}={path!r}: the folder {folder!r} does not exist")
