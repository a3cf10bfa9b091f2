"""Which training set-ups the benchmarks compare, and how each is built on a rank.

A *variant* is a name: a built-in target of ``paracheck.check.targets.BUILTIN_TARGETS`` (looked
up when asked, so components that land later are benchmarked without touching this file, and
missing ones are skipped), an import path ``package.module:Class``, or one of the set-ups that
only the benchmarks know:

* ``local``: one rank, no wrapper, no communication: the compute floor;
* ``torch-ddp``: ``torch.nn.parallel.DistributedDataParallel`` with ``bucket_cap_mb``;
* ``torch-zero``: torch DDP plus ``ZeroRedundancyOptimizer`` over the same optimizer.

FSDP targets (``fsdp``, ``torch-fsdp``: PyTorch's FSDP2 ``fully_shard`` per parameter-owning
module, ``paracheck.fsdp.torch_fsdp``) are driven as their check drives them: AdamW over the
wrapper's parameters.

The two torch baselines are always built natively here, even when an adapter target of the same
name exists, so that "next to torch" means torch as people use it (gradients reduced by DDP's own
reducer during backward), whatever the adapters do to fit the CS336 protocol.

Every variant is driven through one protocol (``Setup``): ``forward``, ``after_backward()`` (the
CS336 ``finish_gradient_synchronization()``, a no-op for torch DDP), and ``optimizer``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from paracheck.check.kinds import KINDS

__all__ = [
    "VARIANT_ORDER",
    "BASELINES",
    "Setup",
    "available_variants",
    "build_setup",
    "variant_kind",
]

# The order tables are printed in: the DDP progression, then torch, then the sharding designs.
VARIANT_ORDER = (
    "local",
    "naive",
    "flat",
    "overlapped",
    "bucketed",
    "torch-ddp",
    "sharded",
    "zero1",
    "torch-zero",
    "zero2",
    "fsdp",
    "torch-fsdp",
)
BASELINES = ("local", "torch-ddp", "torch-zero")


def _construction(kind: str) -> str | None:
    """How ``build_setup`` constructs a target of ``kind``, read from its constructor
    (``paracheck.check.kinds.Kind.constructor``): ``"wrapper"`` (a DDP read by names, its
    optimizer the benchmark's), ``"optimizer"`` (an optimizer class wrapper behind FlatDDP),
    ``"wrapper+optimizer"`` (``Class(module, optimizer_cls, ...)``, a ZeRO wrapper),
    ``"sharding wrapper"`` (``Class(module)`` read by position, an FSDP wrapper whose parameters
    the benchmark's optimizer steps), or None (a training loop trains its own way)."""
    row = KINDS.get(kind)
    c = None if row is None else row.constructor
    if c is None:
        return None
    if c.by_names:
        return "wrapper"
    if c.wraps_optimizer:
        return "wrapper+optimizer" if c.first[0] == "module" else "optimizer"
    return "sharding wrapper" if c.wraps_module else None


# The target kinds build_setup drives: those it constructs.
DRIVEN_KINDS = frozenset({*BASELINES, *(k for k in KINDS if _construction(k))})


def _builtin_targets() -> dict:
    from paracheck.check.targets import BUILTIN_TARGETS

    return dict(BUILTIN_TARGETS)


def variant_kind(name: str) -> str | None:
    """``"local"``, ``"torch-ddp"``, ``"torch-zero"``, a target kind (``ddp``, ``sharded``,
    ``zero``), or None when ``name`` is neither a baseline nor a target that imports."""
    if name in BASELINES:
        return name
    try:
        from paracheck.check.targets import TargetError, resolve_target

        return resolve_target(name).kind
    except (TargetError, ImportError, AttributeError):
        return None


def available_variants(names=None, *, include_local: bool = False) -> tuple[str, ...]:
    """The variants among ``names`` (default: every known one) that can be built here and that
    ``build_setup`` drives (``DRIVEN_KINDS``), in ``VARIANT_ORDER`` (unknown names after, in the
    order given). Missing ones are dropped."""
    if names is None:
        names = [n for n in VARIANT_ORDER if include_local or n != "local"]
        names += [n for n in _builtin_targets() if n not in VARIANT_ORDER]
    names = list(dict.fromkeys(names))
    ordered = [n for n in VARIANT_ORDER if n in names] + [
        n for n in names if n not in VARIANT_ORDER
    ]
    return tuple(n for n in ordered if variant_kind(n) in DRIVEN_KINDS)


@dataclass
class Setup:
    """A model ready to train under one variant. ``wrapper`` is what holds the communication
    state (DDP wrapper or None); ``optimizer`` is what ``step()`` is called on."""

    name: str
    forward: Callable
    after_backward: Callable[[], None]
    optimizer: object  # has step() and zero_grad(set_to_none=...)
    wrapper: object = None
    before_forward: Callable[[], None] | None = None


def _adamw(params, *, fused: bool, lr: float = 1e-4):
    return torch.optim.AdamW(params, lr=lr, **_adamw_options(fused))


def _adamw_options(fused: bool) -> dict:
    # fused AdamW exists for CUDA tensors only; on CPU the default (foreach) implementation runs.
    return {"fused": True} if fused else {}


def _noop() -> None:
    return None


def build_setup(
    name: str,
    model: torch.nn.Module,
    *,
    bucket_mb: float,
    device: torch.device,
    fused: bool = False,
    process_group=None,
) -> Setup:
    """Wrap ``model`` (already on ``device``) as variant ``name``; a collective on every rank of
    ``process_group`` (the default group when None) except for ``local``."""
    kind = variant_kind(name)
    if kind is None:
        raise ValueError(
            f"variant={name!r} is neither a baseline ({', '.join(BASELINES)}) nor a target that imports"
        )
    if kind == "local":
        return Setup(name, model, _noop, _adamw(model.parameters(), fused=fused))
    if kind in ("torch-ddp", "torch-zero"):
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        ddp = DistributedDataParallel(
            model, device_ids=ids, bucket_cap_mb=bucket_mb, process_group=process_group
        )
        if kind == "torch-ddp":
            opt = _adamw(ddp.parameters(), fused=fused)
        else:
            from torch.distributed.optim import ZeroRedundancyOptimizer

            opt = ZeroRedundancyOptimizer(
                ddp.parameters(),
                optimizer_class=torch.optim.AdamW,
                lr=1e-4,
                process_group=process_group,
                **_adamw_options(fused),
            )
        return Setup(name, ddp, _noop, opt, ddp)

    from paracheck.check.targets import load_object, resolve_target

    target = resolve_target(name)
    cls = load_object(target.path)
    construction = _construction(kind)
    if construction == "wrapper":
        # Built as the rank programs build it (paracheck.check.construction): a benchmark measures
        # the wrapper a check judged.
        import torch.distributed as dist

        from paracheck.check.construction import construct_ddp

        wrapper = construct_ddp(
            cls,
            model,
            path=target.path,
            bucket_mb=bucket_mb,
            takes_bucket=target.takes_bucket,
            rank=dist.get_rank(process_group),
            world_size=dist.get_world_size(process_group),
            process_group=process_group if process_group is not None else dist.group.WORLD,
            device=device,
        )
        opt = _adamw(model.parameters(), fused=fused)
        return Setup(
            name,
            wrapper,
            wrapper.finish_gradient_synchronization,
            opt,
            wrapper,
            getattr(wrapper, "on_train_batch_start", None),
        )
    if construction == "optimizer":
        # As in paracheck.check.ranks.sharded: gradients are synchronised by FlatDDP before step().
        from paracheck.ddp import FlatDDP

        wrapper = FlatDDP(model)
        opt = cls(model.parameters(), torch.optim.AdamW, lr=1e-4, **_adamw_options(fused))
        return Setup(name, wrapper, wrapper.finish_gradient_synchronization, opt, wrapper)
    if construction == "wrapper+optimizer":
        # paracheck.zero.Zero1's interface: a wrapper and an optimizer in one
        # (``Zero1(module, optimizer_cls, bucket_size_mb=..., **defaults)``), reduce-scattering
        # during backward and all-gathering in ``step()``.
        import inspect

        extra = (
            {"bucket_size_mb": bucket_mb}
            if "bucket_size_mb" in inspect.signature(cls).parameters
            else {}
        )
        zero = cls(model, torch.optim.AdamW, lr=1e-4, **extra, **_adamw_options(fused))
        return Setup(
            name,
            zero,
            zero.finish_gradient_synchronization,
            zero,
            zero,
            getattr(zero, "on_train_batch_start", None),
        )
    if construction == "sharding wrapper":
        # As paracheck.check.ranks.fsdp trains the kind: the wrapper shards the module, the
        # optimizer steps the wrapper's parameters (its shards and replicated parameters).
        wrapper = cls(model)
        opt = _adamw(wrapper.parameters(), fused=fused)
        finish = getattr(wrapper, "finish_gradient_synchronization", None) or _noop
        return Setup(name, wrapper, finish, opt, wrapper)
    raise ValueError(f"variant={name!r} has kind={kind!r}, which the benchmarks cannot drive")
