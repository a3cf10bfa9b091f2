"""What ``paracheck check``'s options mean, checked before anything runs: the targets' kind and
properties, the case or the world sizes, the numbers, the precision. Each refuses bad input with
a ``UsageError`` naming the option and its value."""

from __future__ import annotations

import math
import os
import sys

from paracheck.cli._common import UsageError


def _world_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise UsageError(
            f"--world-sizes={text!r} must be comma-separated integers, e.g. 1,2,4"
        ) from None
    if not sizes:
        raise UsageError(f"--world-sizes={text!r} names no world size")
    bad = [s for s in sizes if s < 1]
    if bad:
        raise UsageError(f"--world-sizes={text!r}: world size {bad[0]} must be >= 1")
    return sizes


def _positive(name: str, value, kind=int):
    if value is None:
        return None
    if not value > 0:
        raise UsageError(f"{name}={value!r} must be > 0")
    return value


def _check_rank_limit(
    args, option: str, value: str, sizes: tuple[int, ...], pool: dict | None = None
) -> None:
    """A usage error for gloo world sizes above this machine's limit (Note [Gloo rank limit]), or
    above the number of agents attached."""
    if pool is not None:
        if max(sizes) > pool["size"]:
            raise UsageError(
                f"{option}={value}: world size {max(sizes)} exceeds the {pool['size']} agents at "
                f"--attach={args.attach}"
            )
        return
    if args.backend != "gloo" or args.allow_large_world:
        return
    from paracheck.check.limits import world_size_error

    error = world_size_error(option, value, sizes, "--allow-large-world")
    if error is not None:
        raise UsageError(error)


def _chosen(args, targets: list) -> list:
    """``targets`` checked against ``--kind`` and narrowed to ``--properties``."""
    if args.kind is not None:
        from paracheck.check.interface import kind_mismatch

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


def _case_and_sizes(args, pool: dict | None):
    """The ``--case`` to run as given (or None) and the world sizes to check."""
    case = None
    if args.case is not None and not args.case.strip():
        # An empty $(cat missing.json) would otherwise run the whole search.
        raise UsageError(f"--case={args.case!r}: not a case (give the JSON a failure printed)")
    if args.case:
        from paracheck.cases import Case

        text = args.case
        if not text.lstrip().startswith("{") and os.path.isfile(text):
            with open(text, encoding="utf-8") as f:
                text = f.read()
        try:
            case = Case.from_json(text)
        except Exception as exc:  # noqa: BLE001
            raise UsageError(f"--case is not a valid case: {type(exc).__name__}: {exc}") from None
        sizes = (case.world_size,)
        _check_rank_limit(args, "--case world_size", str(case.world_size), sizes, pool)
    else:
        default = "1,2,3,4" if args.backend == "gloo" else None
        if pool is not None:
            default = ",".join(str(i) for i in range(1, pool["size"] + 1))
        if args.world_sizes is None and default is None:
            import torch

            default = ",".join(str(i) for i in range(1, torch.cuda.device_count() + 1)) or "1"
        sizes = _world_sizes(args.world_sizes or default)
        _check_rank_limit(args, "--world-sizes", args.world_sizes or default, sizes, pool)
    return case, sizes


def _check_numbers(args) -> None:
    """The numeric options and the ``--json`` path."""
    _positive("--timeout", args.timeout)
    _positive("--rank-memory", args.rank_memory)
    if args.budget is not None and not (math.isfinite(args.budget) and args.budget >= 0):
        raise UsageError(f"--budget={args.budget} must be a number of seconds >= 0 (0: no limit)")
    if args.clip_norm is not None and not (math.isfinite(args.clip_norm) and args.clip_norm > 0):
        raise UsageError(f"--clip-norm={args.clip_norm} must be a finite number > 0")
    if args.json not in (None, "-"):
        _writable("--json", args.json)


def _precision(args) -> tuple[str | None, str]:
    """The explicit precision (None: each target's default) and the precision the features are
    checked at, from ``--precision`` and ``--dtype``; ``--contract`` and ``--features`` checked at it."""
    from paracheck.check.features import FeatureError, features_off
    from paracheck.check.property import DTYPE_PRECISIONS
    from paracheck.strategies._core import nominal_dtype

    # None: each target's default (float64; float32 for a loop: paracheck.check.property).
    explicit = args.precision or (None if args.dtype is None else DTYPE_PRECISIONS[args.dtype])
    precision = explicit or "fp64"
    if args.precision is not None and args.dtype is not None:
        if DTYPE_PRECISIONS[args.dtype] != args.precision:
            raise UsageError(
                f"--dtype={args.dtype} and --precision={args.precision} disagree: "
                "give --precision only"
            )
    try:
        features_off(args.contract, args.features, dtype=nominal_dtype(precision))
    except FeatureError as exc:
        raise UsageError(f"--{exc.argument}={exc.value}: {exc.rule}") from None
    return explicit, precision


def _without_refused_loops(args, targets: list, explicit: str | None, precision: str) -> list:
    """``targets`` without the loops that apply their own precision where one is explicit."""
    from paracheck.strategies._loop import loop_precision

    def loop_refuses(t) -> str | None:
        """Why a loop target is not checked at the explicit precision (None: it is)."""
        try:
            loop_precision(explicit, t.autocast)
        except ValueError as exc:
            return str(exc)
        return None

    refused = {t.name: loop_refuses(t) for t in targets if t.kind == "loop" and explicit}
    refused = {name: why for name, why in refused.items() if why}
    if refused:
        named = [name for name in refused if name in (args.targets or ())]
        if named:
            raise UsageError(f"{named[0]}: {refused[named[0]]}")
        print(
            f"paracheck: note: --precision={precision}: the loop targets "
            f"{', '.join(refused)} are not checked (a loop applies autocast and loss scaling "
            "itself)",
            file=sys.stderr,
        )
        targets = [t for t in targets if t.name not in refused]
    return targets


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
