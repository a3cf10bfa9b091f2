"""Targets: what ``paracheck check`` can check, by built-in name or import path.

A target is ``(kind, import path)``. Kinds:

* ``ddp``: a DDP wrapper with the CS336 interface: ``Class(module)`` or
  ``Class(module, bucket_size_mb)``, ``forward``, ``finish_gradient_synchronization()``, and
  optionally ``on_train_batch_start()`` and ``no_sync()``; or a function ``get_ddp(module)``
  returning one, with the after-backward hook a function ``f(ddp_model, optimizer)``
  (``paracheck.check.adapters``);
* ``sharded``: an optimizer ``Class(params, optimizer_cls, **kwargs)`` (CS336 ShardedOptimizer),
  or a function of that signature; gradients are synchronised by paracheck's FlatDDP before its
  ``step()``;
* ``zero``: a ZeRO wrapper ``Class(module, optimizer_cls, *, params, bucket_size_mb, **kwargs)``
  that synchronises gradients itself (``paracheck.zero.Zero1``).

The import path is ``package.module:Name`` or ``path/to/file.py:Name`` (the file is imported
by location, with its directory, or its package's root, on ``sys.path``; the ranks do the same).

Resolving a target runs in the driver: it imports the target (``paracheck.check.loading``),
reads its interface (``paracheck.check.interfaces``, Note [Readings of a DDP interface]) and
settles its kind, hooks and declarations before any case runs. The rank programs read the
interface the same way and never import this module.

Each kind's rank program and properties, and how a target selects a subset
(``Target.properties``), are in ``paracheck.check.kinds``.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from paracheck.check.interfaces import (
    GATHER_METHODS,
    Construction,
    check_supplied,
    companion_hooks,
    ddp_construction,
    declares,
    gather_candidates,
    missing_hook_message,
    plausible_hooks,
    resolve_hook,
    takes_keyword,
)
from paracheck.check.kinds import KINDS, PARAMETERS, STEP, STUB_RANK_FN, default_properties
from paracheck.check.loading import (
    IMPORT_SECONDS,
    ExitAtImport,
    ImportTimeout,
    TargetError,
    guarded_import,
    import_module,
    is_file_spec,
    load_object,
)
from paracheck.check.ranks.job import RankJob

if TYPE_CHECKING:
    from paracheck.cases import Case
    from paracheck.workloads.user import UserModel

__all__ = [
    "Target",
    "BUILTIN_TARGETS",
    "BUILTIN_PROPERTIES",
    "resolve_target",
    "with_gather",
    "targets_help",
    "with_reduce_dtype",
    # read from paracheck.check.loading and paracheck.check.interfaces, where they are defined
    "IMPORT_SECONDS",
    "Construction",
    "ExitAtImport",
    "ImportTimeout",
    "TargetError",
    "check_supplied",
    "ddp_construction",
    "guarded_import",
    "import_module",
    "load_object",
    "plausible_hooks",
    "takes_keyword",
]


@dataclass(frozen=True)
class Target:
    name: str
    path: str  # "package.module:Class" or "/abs/file.py:function"
    kind: str  # a kind of paracheck.check.kinds.KINDS
    takes_bucket: bool = False
    # Which properties a check runs (None: the kind's defaults; paracheck.check.kinds).
    properties: frozenset[str] | None = None
    # DDP hooks (Note [Readings of a DDP interface]): a method name, or "module:function" called as
    # f(ddp_model, optimizer); None: finish_gradient_synchronization() / on_train_batch_start().
    finish: str | None = None
    batch_start: str | None = None
    # Replace CUDA timing/instrumentation calls by no-ops on the ranks (paracheck.check.ranks._cuda_stub).
    stub_cuda_timing: bool = False
    # What resolving the target found worth saying (a plausible hook not used, ...); not checked.
    notes: tuple[str, ...] = field(default=(), compare=False)
    # loop: the loss semantics the step minimises (Note [Loss semantics]): --loss, else the
    # function's ``paracheck_loss`` attribute, else "token-mean".
    loss: str | None = None
    # loop: the global gradient norm the step clips to (``clip_grad_norm_``), or None: the
    # function's ``paracheck_clip_norm`` attribute, or --clip-norm.
    clip_norm: float | None = None
    # ddp: the dtype the target declares it reduces gradients in (Note [Declared reduction
    # dtype]): --reduce-dtype, else the class's ``paracheck_reduce_dtype`` attribute, else None.
    reduce_dtype: str | None = None
    # loop: the dtype the step's forwards autocast to (Note [A loop's own precision]): the
    # function's ``paracheck_autocast`` attribute, else None; and whether the step takes a
    # ``scaler`` (a ``torch.amp.GradScaler``, passed where the case scales its loss).
    autocast: str | None = None
    scaler: bool = False
    # fsdp: how the check reads the parameters whole (Note [Reading an FSDP]): a method name, or
    # "module:function" called as f(wrapper); None: the first of GATHER_METHODS the wrapper has.
    gather: str | None = None
    # The user's model every case trains (``--model``, ``--batch``, ``--loss-fn``; a
    # ``paracheck.workloads.user.UserModel``), None: the generated ones.
    user_model: UserModel | None = None

    @property
    def master_weights(self) -> bool:
        """A sharding target that keeps float32 master weights of bfloat16 parameters, declared by
        a ``master_params()`` method (Note [Master weights] in ``paracheck.cases``), or a fully
        sharded wrapper whose constructor takes ``compute_dtype`` (its float32 shards are the
        masters of the parameters it computes with: Note [Compute dtype of an FSDP]): where its
        kind reads masters (``Kind.masters``)."""
        return declares(self.path, KINDS[self.kind].masters)

    @property
    def reports_gradients(self) -> bool:
        """Whether the rank program records the gradients of every step (a sharded optimizer's
        are its parameters' ``.grad``; a ZeRO wrapper reports them by ``full_gradients()``): a
        sharding target's step is then judged on them (Note [Comparing an update]): where its
        kind reads them (``Kind.step_gradients``)."""
        return declares(self.path, KINDS[self.kind].step_gradients)

    @property
    def rank_fn(self) -> str:
        """The rank program of the target's kind (``paracheck.check.kinds.KINDS``), run inside
        the CUDA stub where ``stub_cuda_timing`` (``job`` names the program)."""
        return STUB_RANK_FN if self.stub_cuda_timing else KINDS[self.kind].rank_fn

    def job(self, case: Case, *, device: str | None = None) -> RankJob:
        """The job of running ``case`` on the target, as its rank program reads it
        (``paracheck.check.ranks.job``; ``stubbed``: the program ``rank_fn`` runs inside the stub)."""
        return RankJob(
            case=case,
            path=self.path,
            kind=self.kind,
            device=device,
            takes_bucket=self.takes_bucket,
            finish=self.finish,
            batch_start=self.batch_start,
            scaler=self.scaler,
            gather=self.gather,
            stubbed=KINDS[self.kind].rank_fn if self.stub_cuda_timing else None,
        )

    def cli_options(self) -> str:
        """The ``paracheck check`` options, after the target's name, that reproduce this target."""
        out = ""
        if self.finish is not None:
            out += f" --finish {self.finish}"
        if self.batch_start is not None:
            out += f" --batch-start {self.batch_start}"
        if self.stub_cuda_timing:
            out += " --stub-cuda-timing"
        if self.loss is not None:
            out += f" --loss {self.loss}"
        if self.clip_norm is not None:
            out += f" --clip-norm {self.clip_norm:g}"
        if self.reduce_dtype is not None:
            out += f" --reduce-dtype {self.reduce_dtype}"
        if self.gather is not None:
            out += f" --gather {self.gather}"
        if self.user_model is not None:
            from paracheck.check.user_model import model_options

            out += model_options(self.user_model)
        return out


# name -> (path, kind).
BUILTIN_TARGETS: dict[str, tuple[str, str]] = {
    "naive": ("paracheck.ddp:NaiveDDP", "ddp"),
    "flat": ("paracheck.ddp:FlatDDP", "ddp"),
    "overlapped": ("paracheck.ddp.overlapped:OverlappedDDP", "ddp"),
    "bucketed": ("paracheck.ddp.bucketed:BucketedDDP", "ddp"),
    "torch-ddp": ("paracheck.ddp.torch_ddp:TorchDDP", "ddp"),
    "sharded": ("paracheck.zero:ShardedOptimizer", "sharded"),
    "sharded-master": ("paracheck.zero:MasterWeightsShardedOptimizer", "sharded"),
    "zero1": ("paracheck.zero:Zero1", "zero"),
    "zero1-master": ("paracheck.zero:MasterWeightsZero1", "zero"),
    "zero2": ("paracheck.zero:Zero2", "zero2"),
    "torch-zero": ("paracheck.zero.torch_zero:TorchZero", "sharded"),
    "fsdp": ("paracheck.fsdp:FSDP", "fsdp"),
    "torch-fsdp": ("paracheck.fsdp.torch_fsdp:TorchFSDP", "fsdp"),
    "loop": ("paracheck.loop:train_step", "loop"),
    "loop-batch-mean": ("paracheck.loop:train_step_batch_mean", "loop"),
}

# Built-ins checked on a subset of properties by default. torch's ZeroRedundancyOptimizer breaks
# "balance" and "traffic" by design (docs/findings-torch-zero.md); select them explicitly to see it.
BUILTIN_PROPERTIES: dict[str, frozenset[str]] = {
    "torch-zero": frozenset({"equivalence", "float64-bound", "state", "memory", "reshard"}),
    # torch's fully_shard reduce-scatters a module called twice per forward twice in the backward
    # after a no_sync() micro-batch (docs/findings-torch-fsdp.md): select reduced-once to see it.
    "torch-fsdp": frozenset(
        {"equivalence", "float64-bound", "freed", "gather-dtype", "params-sharded", "reshard"}
    ),
}


# -- kinds --------------------------------------------------------------------------------------


def _param_names(obj) -> list[str]:
    try:
        sig = inspect.signature(obj.__init__ if inspect.isclass(obj) else obj)
    except (TypeError, ValueError):
        raise TargetError("cannot read the constructor's signature") from None
    return [p for p in sig.parameters if p != "self"]


def _is_optimizer_arg(name: str) -> bool:
    return "optim" in name.lower()


def _infer_kind(cls, path: str, finish: str | None = None) -> tuple[str, bool]:
    if not inspect.isclass(cls) and not inspect.isfunction(cls):
        raise TargetError(f"target={path!r} is a {type(cls).__name__}, not a class or a function")
    try:
        names = _param_names(cls)
    except TargetError as exc:
        raise TargetError(f"target={path!r}: {exc}") from None
    import torch

    first = names[0].lower() if names else ""
    if len(names) >= 2 and first in ("module", "model") and _is_optimizer_arg(names[1]):
        return (
            "zero",
            False,
        )  # Class(module, optimizer_cls, ...): a ZeRO wrapper (paracheck.zero.Zero1)
    if (inspect.isclass(cls) and issubclass(cls, torch.optim.Optimizer)) or (
        len(names) >= 2 and _is_optimizer_arg(names[1])
    ):
        return "sharded", False
    if inspect.isclass(cls) and any(hasattr(cls, m) for m in GATHER_METHODS):
        return "fsdp", False  # a wrapper that can give its sharded parameters whole
    if inspect.isclass(cls) and (
        "compute_dtype" in names or "fsdp" in cls.__name__.lower().replace("_", "")
    ):
        # The CS336 FSDP(module, compute_dtype=None), or a class named so, without a reader.
        others = gather_candidates(cls)
        hint = f"; it has {', '.join(m + '()' for m in others)}" if others else ""
        raise TargetError(
            f"target={path!r} looks like a fully sharded wrapper but has none of "
            f"{', '.join(m + '()' for m in GATHER_METHODS)}{hint}: name the method (or "
            "module:function called as f(wrapper)) that returns every parameter whole with "
            "--gather NAME (gather=... in paracheck_check)"
        )
    if (
        inspect.isfunction(cls)
        or finish is not None
        or hasattr(cls, "finish_gradient_synchronization")
    ):
        check_supplied(cls, "ddp", path)
        try:
            return "ddp", ddp_construction(cls).takes_bucket
        except TargetError as exc:
            raise TargetError(f"target={path!r}: {exc}") from None
    raise TargetError(missing_hook_message(cls, path))


def _looks_like_a_step(obj) -> bool:
    """``train_step(model, optimizer, micro_batches)``: a function whose third argument names
    batches."""
    if not inspect.isfunction(obj):
        return False
    try:
        names = _param_names(obj)
    except TargetError:
        return False
    return (
        len(names) >= 3
        and names[0].lower() in ("model", "module")
        and "opt" in names[1].lower()
        and "batch" in names[2].lower()
    )


def _loop_target(
    name: str,
    path: str,
    obj,
    loss: str | None,
    clip_norm: float | None = None,
    stub_cuda_timing: bool = False,
) -> Target:
    """A ``loop`` target: ``obj`` is a function, or a class whose instance is called, as
    ``step(model, optimizer, micro_batches)``."""
    from paracheck.strategies._loop import LOOP_LOSSES

    if not callable(obj):
        raise TargetError(
            f"target={name!r} is a {type(obj).__name__}: a loop target is a function "
            "train_step(model, optimizer, micro_batches) or a class whose instances are called so"
        )
    if loss is None:
        loss = getattr(obj, "paracheck_loss", None) or "token-mean"
    if loss not in LOOP_LOSSES:
        raise TargetError(f"loss={loss!r} must be one of {', '.join(LOOP_LOSSES)}")
    if clip_norm is None:
        clip_norm = getattr(obj, "paracheck_clip_norm", None)
    if clip_norm is not None and not (isinstance(clip_norm, (int, float)) and clip_norm > 0):
        raise TargetError(f"clip_norm={clip_norm!r} must be a number > 0")
    autocast, scaler = _loop_precision(name, obj)
    return Target(
        name,
        path,
        "loop",
        loss=loss,
        clip_norm=None if clip_norm is None else float(clip_norm),
        autocast=autocast,
        scaler=scaler,
        stub_cuda_timing=stub_cuda_timing,
    )


# Note [A loop's own precision]
#   A training step opens its own ``torch.autocast`` and drives its own ``GradScaler``, so what it
#   computes in is the step's declaration, not a draw: ``paracheck_autocast = "float16"`` (or
#   ``"bfloat16"``) on the function or class says its forwards run under ``torch.autocast(
#   device_type, dtype)`` over float32 parameters, and every case is drawn so (the oracle applies
#   the same casts: Note [Precision of a case]). A step with a parameter named ``scaler`` is given
#   a ``torch.amp.GradScaler`` as ``scaler=`` and must scale its losses, ``unscale_`` before
#   anything reads the gradients (a clip), ``step`` and ``update`` it; its cases scale the loss as
#   the fp16 precision's do (a first backward that overflows on every rank, or none). A scaler is
#   for float16 compute: a step taking one declares ``paracheck_autocast = "float16"``, or gets it.


def _loop_precision(name: str, obj) -> tuple[str | None, bool]:
    """A loop's declared autocast dtype and whether it takes a ``scaler`` (Note [A loop's own
    precision]); a TargetError for a declaration that cannot be checked."""
    from paracheck.cases import AUTOCAST_DTYPES

    fn = obj.__call__ if inspect.isclass(obj) else obj
    try:
        scaler = "scaler" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        scaler = False
    declared = getattr(obj, "paracheck_autocast", None)
    if declared is None:
        return ("float16" if scaler else None), scaler
    text = str(declared).removeprefix("torch.")
    if text not in AUTOCAST_DTYPES:
        raise TargetError(
            f"paracheck_autocast={declared!r} must be one of {', '.join(sorted(AUTOCAST_DTYPES))} "
            f"(target {name!r})"
        )
    if scaler and text != "float16":
        raise TargetError(
            f"paracheck_autocast={text!r} with a scaler parameter (target {name!r}): a "
            "GradScaler is for float16 compute; declare 'float16'"
        )
    return text, scaler


def resolve_target(
    name: str,
    kind: str | None = None,
    *,
    finish: str | None = None,
    batch_start: str | None = None,
    stub_cuda_timing: bool = False,
    loss: str | None = None,
    clip_norm: float | None = None,
    reduce_dtype: str | None = None,
    gather: str | None = None,
) -> Target:
    """A built-in name or an import path -> Target (imports it here, to fail early and clearly).

    ``finish`` / ``batch_start`` name the DDP hooks (Note [Readings of a DDP interface]);
    ``loss`` the loss semantics of a ``loop`` target (Note [Loss semantics]) and ``clip_norm``
    the global norm it clips its gradients to; ``reduce_dtype`` the dtype a DDP target reduces
    its gradients in (Note [Declared reduction dtype]; default: its class's
    ``paracheck_reduce_dtype``); ``gather`` how an FSDP target's parameters are read whole (a
    method name or ``module:function`` called as ``f(wrapper)``; it makes the kind ``fsdp``).
    """
    if gather is not None and kind is None and name not in BUILTIN_TARGETS:
        kind = "fsdp"
    target = _resolve(name, kind, finish, batch_start, stub_cuda_timing, loss, clip_norm)
    return with_gather(with_reduce_dtype(target, reduce_dtype), gather)


def with_gather(target: Target, gather: str | None) -> Target:
    """``target`` reading its parameters whole through ``gather`` (Note [Reading an FSDP]); a
    TargetError naming the value where it is neither a method of the class nor a function."""
    if gather is None:
        return target
    if PARAMETERS not in KINDS[target.kind].owns:  # only a wrapper keeping shards is gathered
        raise TargetError(
            f"gather={gather!r} is for fsdp targets; {target.name!r} is a {target.kind} target"
        )
    if ":" in gather:
        fn = load_object(gather)
        if not callable(fn):
            raise TargetError(f"gather={gather!r} is a {type(fn).__name__}, not a function")
        return dataclasses.replace(target, gather=gather)
    cls = load_object(target.path)
    if inspect.isclass(cls) and not callable(getattr(cls, gather, None)):
        others = gather_candidates(cls)
        hint = f"; it has {', '.join(m + '()' for m in others)}" if others else ""
        raise TargetError(
            f"gather={gather!r}: target {target.name!r} has no method {gather}(){hint} (or name "
            "a module:function called as f(wrapper))"
        )
    return dataclasses.replace(target, gather=gather)


def with_reduce_dtype(target: Target, given=None) -> Target:
    """``target`` with its declared reduction dtype (``given``, else its class's attribute) and
    the ``reduce-dtype`` property added to its defaults; a TargetError for a bad declaration."""
    from paracheck.check.properties.reduce_dtype import REDUCE_DTYPES

    declared = given
    if declared is None:
        declared = getattr(load_object(target.path), "paracheck_reduce_dtype", None)
        if declared is None:
            return target
    text = str(declared).removeprefix("torch.")
    if text not in REDUCE_DTYPES:
        raise TargetError(
            f"reduce_dtype={declared!r} must be one of {', '.join(REDUCE_DTYPES)} "
            f"(target {target.name!r})"
        )
    if "reduce-dtype" not in KINDS[target.kind].properties:
        raise TargetError(
            f"reduce_dtype={text!r} is declared for DDP and FSDP targets; {target.name!r} is a "
            f"{target.kind} target"
        )
    base = target.properties or default_properties(target.kind, target.takes_bucket)
    return dataclasses.replace(
        target, reduce_dtype=text, properties=frozenset(base) | {"reduce-dtype"}
    )


def _by_names(kind: str | None) -> bool:
    """Whether a ``kind`` target's constructor is read by its arguments' names (a DDP: Note
    [Readings of a DDP interface])."""
    constructor = None if kind is None else KINDS[kind].constructor
    return constructor is not None and constructor.by_names


def _is_step(kind: str | None) -> bool:
    """Whether a ``kind`` target is a training step, called rather than constructed."""
    return kind is not None and STEP in KINDS[kind].owns


def _resolve(name, kind, finish, batch_start, stub_cuda_timing, loss, clip_norm) -> Target:
    if kind is not None and kind not in KINDS:
        raise TargetError(f"kind={kind!r} must be one of {', '.join(repr(k) for k in KINDS)}")
    if name in BUILTIN_TARGETS and _is_step(BUILTIN_TARGETS[name][1]):
        path = BUILTIN_TARGETS[name][0]
        return _loop_target(name, path, load_object(path), loss, stub_cuda_timing=stub_cuda_timing)
    if name in BUILTIN_TARGETS:
        path, builtin_kind = BUILTIN_TARGETS[name]
        cls = load_object(path)
        module = path.rpartition(":")[0]
        return Target(
            name,
            path,
            builtin_kind,
            _infer_kind(cls, path)[1] if _by_names(builtin_kind) else False,
            BUILTIN_PROPERTIES.get(name),
            finish=None if finish is None else resolve_hook("--finish", finish, cls, module, name),
            batch_start=None
            if batch_start is None
            else resolve_hook("--batch-start", batch_start, cls, module, name),
            stub_cuda_timing=stub_cuda_timing,
        )
    if ":" not in name:
        raise TargetError(
            f"target={name!r} is not a built-in target ({', '.join(BUILTIN_TARGETS)}) "
            f"nor an import path 'package.module:Class' or 'file.py:Name'"
        )
    cls = load_object(name)
    module_part, _, attr = name.rpartition(":")
    path = f"{os.path.abspath(module_part)}:{attr}" if is_file_spec(module_part) else name
    if _is_step(kind) or (kind is None and _looks_like_a_step(cls)):
        return _loop_target(name, path, cls, loss, clip_norm, stub_cuda_timing)
    if loss is not None or clip_norm is not None:
        raise TargetError(
            f"loss={loss!r}, clip_norm={clip_norm!r} are for loop targets; {name!r} is not one "
            "(--kind loop)"
        )
    # A CS336 adapter constructor named by path (adapters.py:get_ddp_bucketed) brings its own
    # hooks from its module, as --adapters checks it (paracheck.check.adapters).
    hooks = companion_hooks(cls, path) if inspect.isfunction(cls) else {}
    if finish is not None:
        hooks["finish"] = resolve_hook("--finish", finish, cls, path.rpartition(":")[0], name)
    if batch_start is not None:
        hooks["batch_start"] = resolve_hook(
            "--batch-start", batch_start, cls, path.rpartition(":")[0], name
        )
    inferred, bucket = (
        _infer_kind(cls, name, hooks.get("finish")) if kind is None else (kind, False)
    )
    check_supplied(cls, inferred, name)
    if _by_names(kind):
        try:
            bucket = ddp_construction(cls).takes_bucket
        except TargetError as exc:
            raise TargetError(f"target={name!r}: {exc}") from None
    notes = ()
    if (
        _by_names(inferred)
        and inspect.isclass(cls)
        and hooks.get("batch_start") is None
        and not hasattr(cls, "on_train_batch_start")
    ):
        others = plausible_hooks(cls, "batch_start")
        if others:
            notes = (
                f"{name} has no on_train_batch_start(); it has {others[0]}(): if that must run before each "
                f"batch, pass --batch-start {others[0]}",
            )
    properties = KINDS[inferred].adapter_properties if inspect.isfunction(cls) else None
    return Target(
        name,
        path,
        inferred,
        bucket,
        properties,
        finish=hooks.get("finish"),
        batch_start=hooks.get("batch_start"),
        stub_cuda_timing=stub_cuda_timing,
        notes=notes,
    )


def targets_help() -> str:
    """What ``paracheck check --help`` says a TARGET can be: the built-in names by kind, and the
    two forms of an import path."""
    by_kind: dict[str, list[str]] = {}
    for name, (_, kind) in BUILTIN_TARGETS.items():
        by_kind.setdefault(kind, []).append(name)
    width = max(len(k) for k in by_kind)
    lines = [
        "TARGET is a built-in name (default: the main job, every one but the torch-* peers; "
        "--all: every one), by kind:"
    ]
    lines += [f"  {k:<{width}}  {', '.join(names)}" for k, names in by_kind.items()]
    lines += [
        "or an import path, its kind read from its interface (or given with --kind):",
        "  package.module:Class   a class or function importable from sys.path or the working",
        "                         directory",
        "  path/to/file.py:Name   a class or function in a file, imported by location",
    ]
    return "\n".join(lines)
