"""Targets: what ``paracheck check`` can check, by built-in name or import path.

A target is ``(kind, import path)``. Kinds:

* ``ddp``: a module wrapper with the CS336 interface: ``Class(module)`` or
  ``Class(module, bucket_size_mb)``, ``forward``, ``finish_gradient_synchronization()``, and
  optionally ``on_train_batch_start()`` and ``no_sync()``;
* ``sharded``: an optimizer ``Class(params, optimizer_cls, **kwargs)`` (CS336 ShardedOptimizer);
  gradients are synchronised by paracheck's FlatDDP before its ``step()``;
* ``zero``: a ZeRO wrapper ``Class(module, optimizer_cls, *, params, bucket_size_mb, **kwargs)``
  that synchronises gradients itself (``paracheck.zero.Zero1``).

The sharding kinds' properties, and how a target selects a subset (``Target.properties``), are in
``paracheck.check._rank_zero``.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass

__all__ = ["Target", "BUILTIN_TARGETS", "resolve_target", "TargetError", "load_object"]


class TargetError(ValueError):
    """A target that cannot be used: unknown name, import failure, or unusable interface."""


@dataclass(frozen=True)
class Target:
    name: str
    path: str  # "package.module:Class"
    kind: str  # "ddp" | "sharded" | "zero"
    takes_bucket: bool = False
    # Which properties a check runs (None: all of the kind's; see paracheck.check._rank_zero.PROPERTIES).
    properties: frozenset[str] | None = None

    @property
    def rank_fn(self) -> str:
        return {
            "ddp": "paracheck.check._rank:run_ddp",
            "sharded": "paracheck.check._rank_zero:run_sharded",
            "zero": "paracheck.check._rank_zero:run_zero",
        }[self.kind]


# name -> (path, kind). Later issues register more (overlapped, bucketed, sharded, zero1, ...).
BUILTIN_TARGETS: dict[str, tuple[str, str]] = {
    "naive": ("paracheck.ddp:NaiveDDP", "ddp"),
    "flat": ("paracheck.ddp:FlatDDP", "ddp"),
    "overlapped": ("paracheck.ddp.overlapped:OverlappedDDP", "ddp"),
    "bucketed": ("paracheck.ddp.bucketed:BucketedDDP", "ddp"),
    "torch-ddp": ("paracheck.ddp.torch_ddp:TorchDDP", "ddp"),
    "sharded": ("paracheck.zero:ShardedOptimizer", "sharded"),
    "zero1": ("paracheck.zero:Zero1", "zero"),
    "torch-zero": ("paracheck.zero.torch_zero:TorchZero", "sharded"),
}

# Built-ins checked on a subset of properties by default. torch's ZeroRedundancyOptimizer breaks
# "balance" and "traffic" by design (docs/findings-torch-zero.md); select them explicitly to see it.
BUILTIN_PROPERTIES: dict[str, frozenset[str]] = {
    "torch-zero": frozenset({"equivalence", "state", "memory"}),
}


def load_object(path: str):
    module, sep, name = path.partition(":")
    if not sep or not module or not name:
        raise TargetError(f"target={path!r} must be a built-in name or 'package.module:Class'")
    try:
        obj = importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's to read
        raise TargetError(f"target={path!r}: module {module!r} does not import: {type(exc).__name__}: {exc}") from exc
    for part in name.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise TargetError(f"target={path!r}: module {module!r} has no attribute {part!r}") from None
    return obj


def _infer_kind(cls, path: str) -> tuple[str, bool]:
    if not inspect.isclass(cls):
        raise TargetError(f"target={path!r} is a {type(cls).__name__}, not a class")
    try:
        sig = inspect.signature(cls.__init__)
    except (TypeError, ValueError):
        raise TargetError(f"target={path!r}: cannot read the constructor's signature") from None
    names = [p for p in sig.parameters if p != "self"]
    positional = [p.name for p in sig.parameters.values()
                  if p.name != "self" and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    import torch

    if len(names) >= 2 and names[0] == "module" and names[1] in ("optimizer_cls", "optimizer_class"):
        return "zero", False  # Class(module, optimizer_cls, ...): a ZeRO wrapper (paracheck.zero.Zero1)
    if issubclass(cls, torch.optim.Optimizer) or (len(names) >= 2 and names[1] in ("optimizer_cls", "optimizer_class")):
        return "sharded", False
    if hasattr(cls, "finish_gradient_synchronization"):
        return "ddp", "bucket_size_mb" in names or len(positional) >= 2
    raise TargetError(
        f"target={path!r} fits neither interface: a DDP wrapper needs Class(module[, bucket_size_mb]) with "
        f"finish_gradient_synchronization(); a sharded optimizer needs Class(params, optimizer_cls, **kwargs) "
        f"(a torch.optim.Optimizer subclass). Pass --kind to say which it is."
    )


def resolve_target(name: str, kind: str | None = None) -> Target:
    """A built-in name or an import path -> Target (imports it here, to fail early and clearly)."""
    if name in BUILTIN_TARGETS:
        path, builtin_kind = BUILTIN_TARGETS[name]
        cls = load_object(path)
        return Target(name, path, builtin_kind, _infer_kind(cls, path)[1] if builtin_kind == "ddp" else False,
                      BUILTIN_PROPERTIES.get(name))
    if ":" not in name:
        raise TargetError(f"target={name!r} is not a built-in target ({', '.join(BUILTIN_TARGETS)}) "
                          f"nor an import path 'package.module:Class'")
    cls = load_object(name)
    inferred, bucket = _infer_kind(cls, name) if kind is None else (kind, False)
    if kind is not None:
        if kind not in ("ddp", "sharded", "zero"):
            raise TargetError(f"kind={kind!r} must be 'ddp', 'sharded' or 'zero'")
        if kind == "ddp":
            bucket = "bucket_size_mb" in inspect.signature(cls.__init__).parameters
    return Target(name, name, inferred, bucket)
