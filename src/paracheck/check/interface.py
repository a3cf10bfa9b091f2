"""What a target's interface offers, read from its class before any case runs: whether it fits
the kind it is checked as (``kind_mismatch``) and which optional case features it cannot be
asked for (``unsupported``), each with the method it lacks."""

from __future__ import annotations

import inspect

from paracheck.check.kinds import GRADIENTS, KINDS, OPTIMIZER, PARAMETERS, STEP

__all__ = ["kind_mismatch", "unsupported"]


def _steps_optimizer(kind: str) -> bool:
    """Whether a ``kind`` target owns the optimizer's step (a sharded optimizer, a ZeRO wrapper)."""
    return kind in KINDS and OPTIMIZER in KINDS[kind].owns


def _object(target):
    from paracheck.check.targets import TargetError, load_object

    try:
        return load_object(target.path)
    except TargetError:
        return None


def _is_subclass(obj, module: str, name: str) -> bool:
    import importlib

    try:
        base = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return False
    return inspect.isclass(obj) and issubclass(obj, base)


def kind_mismatch(target) -> str | None:
    """Why ``target``'s class cannot be a target of its kind (None: it can, or it is not a class
    paracheck can read): a DDP or FSDP kind given an optimizer, a sharded optimizer given a
    module, a ZeRO wrapper without ``step()``, a loop given a class: each read from the kind's
    row (its constructor's first arguments, what it owns)."""
    obj = _object(target)
    if obj is None or not inspect.isclass(obj):
        return None  # a function (a loop, get_ddp) or nothing readable: the ranks will say
    kind = target.kind
    row = KINDS.get(kind)
    if row is None:
        return None
    wraps_module = row.constructor is not None and row.constructor.wraps_module
    is_module = _is_subclass(obj, "torch.nn", "Module")
    is_optimizer = _is_subclass(obj, "torch.optim", "Optimizer")
    name = obj.__name__
    if wraps_module and is_optimizer:
        return (
            f"{name} is a torch.optim.Optimizer, not a module wrapper: a {kind} target wraps a "
            "module (Class(module, ...)); check a sharded optimizer with --kind sharded"
        )
    if wraps_module and not is_module and not callable(getattr(obj, "forward", None)):
        return f"{name} has no forward(): a {kind} target wraps a module and runs its forward"
    if row.constructor is not None and row.constructor.is_optimizer and is_module:
        return (
            f"{name} is a torch.nn.Module, not an optimizer: a sharded target is an optimizer "
            "(Class(params, optimizer_cls, **kwargs)); check a module wrapper with --kind ddp"
        )
    if _steps_optimizer(kind) and not callable(getattr(obj, "step", None)):
        return f"{name} has no step(): a {kind} target steps the optimizer it shards"
    if STEP in row.owns:
        return f"{name} is a class: a loop target is a function train_step(model, optimizer, ...)"
    return None


# The methods an optional case feature asks of the target's class, by the kinds that ask it:
# a reload asks an optimizer it steps for its state; no_sync() is a wrapper's that synchronises
# the gradients (without one, the rank program synchronises every micro-step, and the row would
# check plain accumulation under the no-sync name).
def _needed(kind: str, feature: str) -> tuple[str, ...]:
    if feature in ("reload", "reshard") and _steps_optimizer(kind):
        return ("state_dict", "load_state_dict")
    if feature == "no-sync" and kind in KINDS and GRADIENTS in KINDS[kind].owns:
        return ("no_sync",)
    return ()


# Note [Resuming at another world size] in paracheck.check.properties.reshard: a fully sharded
# wrapper's state is per-rank unless its class declares DCP checkpoints (its shards are DTensors,
# which torch.distributed.checkpoint reshards: paracheck.check.ranks.reshard_dcp.DCP).
RESHARD_PER_RANK = (
    "its optimizer steps each rank's own shard parameters, so its state is per-rank by contract "
    "and cannot be loaded at another world size (a wrapper of DTensor shards declares "
    'paracheck_checkpoint = "torch.distributed.checkpoint")'
)
_DCP = "torch.distributed.checkpoint"


def unsupported(target, feature: str) -> str | None:
    """Why ``target`` cannot be asked for the optional case ``feature`` (None: it can): the method
    its class lacks, as "Class has no no_sync()". A target that is not a class (a function that
    builds the wrapper: an adapter) is not read here: the rank program runs what it returns."""
    if feature == "reshard" and target.kind in KINDS and PARAMETERS in KINDS[target.kind].owns:
        obj = _object(target)
        return None if getattr(obj, "paracheck_checkpoint", None) == _DCP else RESHARD_PER_RANK
    needed = _needed(target.kind, feature)
    if not needed:
        return None
    obj = _object(target)
    if obj is None or not inspect.isclass(obj):
        return None
    missing = [m for m in needed if not callable(getattr(obj, m, None))]
    if missing:
        return f"{obj.__name__} has no {missing[0]}()"
    return None
