"""Analytic memory per rank: optimizer state from a partition, and a training-step breakdown.

Everything here is exact arithmetic on sizes, checked bit-for-bit against what ranks hold
(``tests/regression/test_sharding_exact.py``) and against CUDA peaks (``scripts/memory_xl.py``).

Note [Optimizer state per tensor]
    torch's optimizers keep, per parameter tensor they have stepped at least once:
    SGD with momentum != 0: ``momentum_buffer`` (one element per element), none without momentum;
    Adam / AdamW: ``exp_avg`` and ``exp_avg_sq`` (two per element, three with ``amsgrad``) and a
    0-dimensional ``step`` tensor of torch's scalar dtype (float32, float64 when the default dtype
    is float64 at step time; on the device with ``fused``/``capturable``, the same bytes). So one
    tensor of n elements of e bytes costs ``per_element * n * e + per_tensor`` bytes
    (``StateModel``). A tensor never stepped (no gradient at any step so far) has no state. A
    ZeRO-1 piece is a tensor of its own: every piece carries its own ``step``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

__all__ = [
    "DESIGNS",
    "MemoryBreakdown",
    "StateModel",
    "flat_state_bytes",
    "measured_state_bytes",
    "sharded_state_bytes",
    "state_model",
    "training_memory",
    "zero_construction_bytes",
]


@dataclass(frozen=True)
class StateModel:
    """Bytes of optimizer state of one tensor: ``per_element * numel * element_size + per_tensor``."""

    per_element: int
    per_tensor: int

    def bytes(self, numel: int, element_size: int) -> int:
        return self.per_element * numel * element_size + self.per_tensor


def _scalar_bytes() -> int:
    return 8 if torch.get_default_dtype() == torch.float64 else 4


_NAMES = {torch.optim.SGD: "sgd", torch.optim.Adam: "adam", torch.optim.AdamW: "adamw"}


def state_model(optimizer, options: Mapping | None = None) -> StateModel:
    """Note [Optimizer state per tensor] for ``optimizer`` (``"sgd"``, ``"adam"``, ``"adamw"`` or
    the torch class) with a group's ``options`` (momentum, amsgrad)."""
    name = _NAMES.get(optimizer, optimizer) if isinstance(optimizer, type) else optimizer
    options = dict(options or {})
    if name == "sgd":
        return StateModel(1 if options.get("momentum", 0) != 0 else 0, 0)
    if name in ("adam", "adamw"):
        return StateModel(3 if options.get("amsgrad", False) else 2, _scalar_bytes())
    raise ValueError(f"optimizer={optimizer!r} has no state model; known: sgd, adam, adamw")


def sharded_state_bytes(
    owners: Sequence[int | None],
    rank: int,
    *,
    numels: Sequence[int],
    element_sizes: Sequence[int],
    models: Sequence[StateModel | None],
    stateful: Iterable[int],
) -> int:
    """State bytes ``rank`` holds when parameter i (with state: ``i in stateful``) is owned by
    ``owners[i]`` as a whole tensor (``ShardedOptimizer``)."""
    return sum(
        models[i].bytes(numels[i], element_sizes[i]) for i in set(stateful) if owners[i] == rank
    )


def flat_state_bytes(
    pieces, *, element_size: int, models: Sequence[StateModel | None], stateful: Iterable[int]
) -> int:
    """State bytes of the ``pieces`` (``partition.Piece``: param, length) whose parameter has state
    (``Zero1``: each piece is a tensor of its own, Note [Optimizer state per tensor])."""
    stateful = set(stateful)
    return sum(models[p.param].bytes(p.length, element_size) for p in pieces if p.param in stateful)


def measured_state_bytes(state: Mapping) -> int:
    """Bytes of every tensor in an optimizer's ``state`` mapping (param -> dict), as held.

    Iterates ``items()`` only: indexing torch's ``defaultdict`` state would create entries.
    """
    total = 0
    for _, entry in state.items():
        for v in entry.values():
            if torch.is_tensor(v):
                total += v.numel() * v.element_size()
    return total


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes one rank holds across a training step, by role. ``comm`` counts communication buffers
    that live across the step (torch DDP's buckets, presence flags); activations, temporaries and
    allocator slack are the measured rest."""

    params: int
    grads: int
    optimizer_state: int
    comm: int

    @property
    def static(self) -> int:
        return self.params + self.grads + self.optimizer_state

    @property
    def total(self) -> int:
        return self.static + self.comm


DESIGNS = ("ddp", "sharded", "zero1", "zero2", "torch-ddp", "torch-zero")


def training_memory(
    design: str,
    numels: Sequence[int],
    element_size: int,
    world_size: int,
    *,
    rank: int,
    model: StateModel,
    bucket_numel: int | None = None,
    syncs: int = 1,
) -> MemoryBreakdown:
    """Analytic bytes ``rank`` holds after a step of ``design`` over trainable parameters ``numels``
    (every parameter stepped, one group, one dtype and device):

    * ``ddp``: paracheck ``BucketedDDP`` + the optimizer: gradients are views into the buckets of
      several parameters, or lie where autograd put them (a bucket of one parameter): grads = P
      (its presence flags live only while a round is settled);
    * ``sharded``: ``BucketedDDP`` + ``ShardedOptimizer``: state of the parameters
      ``partition_by_size`` gives ``rank``;
    * ``zero1``: ``Zero1``: parameters in padded flat buckets (P'), gradients = the padded bucket
      buffers (P': this rank's reduced chunk is a view of them, Note [Zero1 in-place
      reduce-scatter] in ``paracheck.zero.zero1``), state of this rank's pieces, comm = the
      presence flags (n * e). With ``syncs`` > 1 gradient synchronisations per step (accumulation
      without ``no_sync()``) the later ones also keep the accumulated chunk aside while the buckets
      refill: grads = P' + P'/W at their peak (Note [Zero1 gradient accumulation]);
    * ``zero2``: ``Zero2``: as ``zero1``, but the gradients it keeps are this rank's shards
      (P'/W, whatever ``syncs``); a bucket's full buffer lives only while the bucket is reduced
      (Note [Zero2 gradient lifetime] in ``paracheck.zero.zero2``);
    * ``torch-ddp``: torch ``DistributedDataParallel`` at its defaults: bucket buffers separate from
      ``.grad`` (``gradient_as_bucket_view=False``), comm = P;
    * ``torch-zero``: torch DDP + ``ZeroRedundancyOptimizer``: state by torch's partition (greedy by
      numel, largest first), comm = P.
    """
    from paracheck.zero.partition import flat_layout, partition_by_size

    if design not in DESIGNS:
        raise ValueError(f"design={design!r} must be one of {DESIGNS}")
    if isinstance(syncs, bool) or not isinstance(syncs, int) or syncs < 1:
        raise ValueError(
            f"syncs={syncs!r} must be an int >= 1 (gradient synchronisations per step)"
        )
    e = element_size
    n = list(numels)
    P = sum(n) * e
    everything = range(len(n))
    models = [model] * len(n)
    sizes = [e] * len(n)
    full_state = sum(model.bytes(k, e) for k in n)
    if design == "ddp":
        return MemoryBreakdown(P, P, full_state, 0)
    if design == "torch-ddp":
        return MemoryBreakdown(P, P, full_state, P)
    if design == "sharded":
        owners = partition_by_size([k * e for k in n], world_size).owners
        state = sharded_state_bytes(
            owners, rank, numels=n, element_sizes=sizes, models=models, stateful=everything
        )
        return MemoryBreakdown(P, P, state, 0)
    if design == "torch-zero":
        # torch's ZeroRedundancyOptimizer: sorted by numel (stable), each onto the least total numel.
        loads = [0] * world_size
        owners = [0] * len(n)
        for i in sorted(everything, key=lambda j: -n[j]):
            r = min(range(world_size), key=lambda q: (loads[q], q))
            owners[i] = r
            loads[r] += n[i]
        state = sharded_state_bytes(
            owners, rank, numels=n, element_sizes=sizes, models=models, stateful=everything
        )
        return MemoryBreakdown(P, P, state, P)
    if bucket_numel is None:
        raise ValueError("design='zero1' needs bucket_numel")
    layout = flat_layout(n, world_size, bucket_numel=bucket_numel)
    padded = layout.padded_numel * e
    state = flat_state_bytes(
        layout.pieces(rank), element_size=e, models=models, stateful=everything
    )
    if design == "zero2":
        return MemoryBreakdown(padded, padded // world_size, state, len(n) * e)
    saved = padded // world_size if syncs > 1 else 0  # every bucket divides into W equal chunks
    return MemoryBreakdown(padded, padded + saved, state, len(n) * e)


def zero_construction_bytes(
    design: str, numels: Sequence[int], element_size: int, world_size: int, *, bucket_numel: int
) -> tuple[int, int]:
    """``Zero1`` (``design="zero1"``) or ``Zero2`` (``"zero2"``) constructed over a module whose
    trainable parameters have ``numels`` elements (one dtype, held by nothing but the module):
    ``(most, held)``, the most bytes held at once above what was held before the constructor,
    and the bytes held above it once it returns.

    Bucket by bucket (``flat_layout``): the padded parameter buffer is allocated while the
    bucket's original parameters still exist, re-pointing them frees the originals, then the
    gradient buffer is allocated: the padded bucket (``zero1``) or this rank's shard of it
    (``zero2``). (The presence flags are made by each synchronisation, not here: Note [Zero1
    presence flags].) So ``zero1`` only grows (its gradient buffer alone covers the originals),
    while ``zero2`` holds the most just after the last bucket's parameter buffer is allocated,
    when that bucket's originals are larger than its shard."""
    from paracheck.zero.partition import flat_layout

    if design not in ("zero1", "zero2"):
        raise ValueError(f"design={design!r} must be 'zero1' or 'zero2'")
    e = element_size
    layout = flat_layout(list(numels), world_size, bucket_numel=bucket_numel)
    held = most = 0
    for bucket in layout.buckets:
        held += bucket.padded * e  # the parameter buffer, beside the originals
        most = max(most, held)
        held -= sum(layout.numels[i] for i in bucket.params) * e  # the originals freed
        held += bucket.padded * e // (world_size if design == "zero2" else 1)
        most = max(most, held)
    return most, held
