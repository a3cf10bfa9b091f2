"""What a checkpoint of a measured step costs a rank (``paracheck.bench.step``'s ``account_step``):
the bytes it writes at the save, the bytes it reads at the load, and its peak tensor bytes while
it loads.

Note [Checkpoint bytes]
    A rank's checkpoint is what a user saves after a step: the model's ``state_dict()`` and the
    optimizer's, read as the check reads it (``state_dict_of``: consolidated where the design
    consolidates, torch's ``consolidate_state_dict(to=0)`` protocol onto rank 0). Its bytes are
    those of the distinct tensor storages it holds, each once (a DTensor's: its local shard),
    which is what ``torch.save`` writes beside a few hundred bytes of pickled structure:

    * written per rank at the save: rank 0 writes every tensor it holds; another rank writes its
      own shards only (DTensors, as ``torch.distributed.checkpoint`` has each rank write its
      shards and one rank what every rank holds alike);
    * read per rank at the load: every tensor of the checkpoint the rank resumes from, its own
      shards and what rank 0 wrote for every rank (a consolidated state is read whole by every
      rank: that is its cost);
    * peak during the load: the recorder's peak tensor bytes (Note [Exact quantities] in
      ``paracheck.accounting.record``) while the checkpoint is read into new tensors (a clone of
      each, as ``torch.load`` materialises them) and ``model.load_state_dict()`` and the
      optimizer's ``load_state_dict()`` take it, everything the rank held before included.

    The three are the maximum over ranks, deterministic as the step's other exact quantities;
    -1 where the optimizer has no ``state_dict()`` or ``load_state_dict()`` to measure.
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten, tree_map

__all__ = ["QUANTITIES", "checkpoint_bytes", "measure_checkpoint"]

# StepAccount's fields, in the order of Note [Checkpoint bytes].
QUANTITIES = ("checkpoint_save_bytes", "checkpoint_load_bytes", "peak_load_bytes")


def _is_shard(t: torch.Tensor) -> bool:
    return hasattr(t, "_local_tensor")


def checkpoint_bytes(checkpoint, *, rank: int) -> tuple[int, int]:
    """(bytes written at the save, bytes read at the load) of ``checkpoint`` on ``rank``: the
    distinct storages of its tensors (Note [Checkpoint bytes])."""
    tensors = [t for t in tree_flatten(checkpoint)[0] if torch.is_tensor(t)]
    read = _storage_bytes(tensors)
    written = read if rank == 0 else _storage_bytes([t for t in tensors if _is_shard(t)])
    return written, read


def _storage_bytes(tensors) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        local = getattr(t, "_local_tensor", t)
        if local.device.type == "meta" or local.layout != torch.strided:
            continue
        storage = local.untyped_storage()
        seen[storage._cdata] = storage.nbytes()
    return sum(seen.values())


def measure_checkpoint(model, optimizer, rec, *, rank: int) -> dict:
    """Save and load ``model`` and ``optimizer`` on this rank under the recorder ``rec``: the
    three quantities of Note [Checkpoint bytes]. A collective where ``state_dict()`` is one."""
    from paracheck.check.ranks._optimizer import state_dict_of

    if not all(callable(getattr(optimizer, m, None)) for m in ("state_dict", "load_state_dict")):
        return dict.fromkeys(QUANTITIES, -1)
    checkpoint = {"model": model.state_dict(), "optimizer": state_dict_of(optimizer)}
    written, read = checkpoint_bytes(checkpoint, rank=rank)
    rec.settle(quiet_steps=3, limit_s=0.2)
    rec.reset_peak()
    loaded = tree_map(lambda v: v.clone() if torch.is_tensor(v) else v, checkpoint)
    model.load_state_dict(loaded["model"])
    optimizer.load_state_dict(loaded["optimizer"])
    rec.settle(quiet_steps=3, limit_s=0.2)
    peak = rec.peak_bytes
    return dict(zip(QUANTITIES, (written, read, peak)))
