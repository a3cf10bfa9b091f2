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


def refuse_lockstep(attach: str | None, option: str = "--attach") -> None:
    """A usage error for a driver that torchrun started once per rank (Note [Attached ranks])."""
    from paracheck.world._agent import launched_by_torchrun

    if attach is None and launched_by_torchrun():
        raise UsageError(
            f"this process is rank {os.environ.get('RANK', '?')} of {os.environ.get('WORLD_SIZE', '?')} "
            "that torchrun started: paracheck does not run Hypothesis on every rank in lock-step "
            "(each process would shrink and time its cases on its own, and the ranks would soon run "
            "different cases). Start the ranks as agents and attach one driver: torchrun ... -m "
            f"paracheck.agent, then paracheck check TARGET {option} MASTER_ADDR:MASTER_PORT (or "
            "torchrun ... -m paracheck.agent -- check TARGET)"
        )


def _attached_pool(args) -> dict:
    """The pool at ``--attach`` (its size and backend), with the options that do not apply to it
    refused."""
    from paracheck.world.attached import pool_of

    if args.rank_memory is not None:
        raise UsageError(
            f"--rank-memory={args.rank_memory!r} does not apply with --attach: torchrun owns the "
            "agents, and one stopped for its memory would end the whole job"
        )
    _positive("--attach-timeout", args.attach_timeout, float)
    try:
        pool = pool_of(args.attach, args.attach_timeout)
    except (ValueError, RuntimeError) as exc:  # not HOST:PORT; no agents there
        raise UsageError(str(exc).replace("attach=", "--attach=", 1)) from None
    if args.backend is not None and args.backend != pool["backend"]:
        raise UsageError(
            f"--backend={args.backend} but the agents at --attach={args.attach} run "
            f"{pool['backend']} (paracheck.agent --backend)"
        )
    args.backend = pool["backend"]
    return pool


def planned(args, job):
    """The plan of each target, the ``--case`` (or None) and the world sizes of a check, every
    option checked before any rank starts (a ``UsageError`` names the one that is wrong): the
    command line only maps its options, and the main job's own (``job``, an ``Opening`` of
    ``paracheck.cli._check_summary``), onto ``CheckSettings`` and calls ``plan`` (Note [One plan
    per check])."""
    from paracheck.check.kinds import KINDS, ZERO_FIRST
    from paracheck.check.plan import InvalidArgument, plan, world_sizes
    from paracheck.check.settings import from_namespace
    from paracheck.check.targets import TargetError

    refuse_lockstep(args.attach)
    main_job = job.main_job
    pool = _attached_pool(args) if args.attach is not None else None
    args.backend = args.backend or "gloo"
    try:
        targets = _resolve_targets(args, main_job)
    except TargetError as exc:
        text = str(exc)
        row = None if args.kind is None else KINDS.get(args.kind)
        constructor = None if row is None else row.constructor
        if (
            constructor is not None
            and constructor.wraps_module
            and "requires optimizer_cls" in text
        ):
            # A ZeRO wrapper checked as a module wrapper (a DDP, an FSDP): the kind, not the
            # class, is what to change.
            zero = [
                k
                for k, r in KINDS.items()
                if r.constructor is not None and r.constructor.first[:2] == ZERO_FIRST
            ]
            text = (
                f"--kind={args.kind} does not fit: {text}; a class constructed with the module and "
                f"optimizer_cls is a ZeRO wrapper (--kind {' or '.join(zero)})"
            )
        raise UsageError(text) from None
    targets = _chosen(args, targets)
    case = _case(args)
    _check_flags(args)
    settings = from_namespace(args, case=case, **job.changes)
    try:
        plans = list(plan(settings, targets, pool=pool))
        sizes = plans[0].world_sizes if plans else world_sizes(settings, pool=pool)
    except InvalidArgument as exc:
        raise UsageError(exc.text("--")) from None
    plans = _without_refused_loops(args, plans)
    if case is not None:
        _check_case_fits(args, case, [p.target for p in plans])
    return plans, case, sizes


def _resolve_targets(args, main_job: list[str] | None = None) -> list:
    """The targets named on the command line: built-ins, import paths, and ``--adapters``' designs;
    without any, ``main_job``'s built-ins (Note [The main job] in ``paracheck.cli._check_summary``)."""
    from paracheck.check.targets import BUILTIN_TARGETS, resolve_target

    stub = args.stub_cuda_timing
    if stub and args.backend == "nccl":
        print(
            "paracheck: warning: --stub-cuda-timing is ignored with --backend nccl (the ranks have CUDA)",
            file=sys.stderr,
        )
        stub = False
    targets: list = []
    if args.adapters is not None:
        from paracheck.check.adapters import discover_adapters

        found = discover_adapters(args.adapters, stub_cuda_timing=stub)
        print("\n".join(found.lines()), flush=True)
        targets += found.targets
        if (args.finish or args.batch_start) and not args.targets:
            print(
                "paracheck: warning: --finish/--batch-start are ignored for --adapters (its functions are the hooks)",
                file=sys.stderr,
            )
    if args.targets or args.adapters is None:
        targets += [
            resolve_target(
                n,
                args.kind,
                finish=args.finish,
                batch_start=args.batch_start,
                stub_cuda_timing=stub,
                loss=args.loss,
                clip_norm=args.clip_norm,
                reduce_dtype=args.reduce_dtype,
                gather=args.gather,
            )
            for n in (args.targets or main_job or list(BUILTIN_TARGETS))
        ]
    for t in targets:
        for note in t.notes:
            print(f"paracheck: note: {note}", file=sys.stderr)
    return _on_user_model(args, targets)


def _on_user_model(args, targets: list) -> list:
    """``targets`` checked on the model of ``--model``, ``--batch`` and ``--loss-fn``, checked
    first (Note [A user's model]); a model that cannot run in float64 moves the check to fp32
    (Note [A float32 oracle for a user's model])."""
    from paracheck.check.user_model import UNSUPPORTED_KINDS, info, user_model_of, with_user_model
    from paracheck.errors import ParacheckError

    try:
        user = user_model_of(args.model, args.batch, args.loss_fn)
        if user is not None and not args.targets and args.adapters is None:
            # The main job on a user's model: the built-ins of the kinds that take one.
            targets = [t for t in targets if t.kind not in UNSUPPORTED_KINDS]
        targets = [with_user_model(t, user) for t in targets]
    except ParacheckError as exc:
        text = exc.text("--") if hasattr(exc, "text") else str(exc)
        raise UsageError(text) from None
    if user is not None and not info(user).float64:
        if args.precision not in (None, "fp32") or args.dtype not in (None, "float32"):
            raise UsageError(
                f"--model={user.build}: does not run in float64 ({info(user).why_not}); check "
                "it at --precision fp32"
            )
        print(
            f"paracheck: note: --model={user.build} does not run in float64 "
            f"({info(user).why_not}): checked in float32, against a float32 oracle",
            file=sys.stderr,
        )
        args.precision = "fp32"
    return targets
