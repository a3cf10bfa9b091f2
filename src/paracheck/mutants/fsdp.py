"""Broken fully sharded wrappers (the ``fsdp`` kind): each is ``paracheck.fsdp.FSDP`` with one bug
of the kind FSDP and ZeRO-3 implementations are reported with."""

from __future__ import annotations

import torch.distributed as dist

from paracheck.fsdp import FSDP

__all__ = [
    "AccumulationOverwritesFSDP",
    "FreedBeforeBackwardFSDP",
    "NoDivideFSDP",
    "NoInitialBroadcastFSDP",
    "NoSyncDroppedFSDP",
    "PaddingAtFrontFSDP",
    "ReplicatedNeverReducedFSDP",
]


class NoDivideFSDP(FSDP):
    """Reduce-scatters the sharded gradients with SUM and never divides by the world size."""

    def _reduce_scatter(self, entry, grad):
        out = super()._reduce_scatter(entry, grad)
        return out.mul_(self.world_size)  # BUG: undoes the division


class PaddingAtFrontFSDP(FSDP):
    """Unpads a gathered parameter from the front: where ``numel % W != 0`` every element is
    shifted by the padding (the shards themselves are right)."""

    def _all_gather(self, entry):
        padded = self._gather_padded(entry.shard.detach())
        pad = padded.numel() - entry.numel
        return padded[pad:].view(entry.shape)  # BUG: the padding is at the end


class ReplicatedNeverReducedFSDP(FSDP):
    """Shards and reduces the matrices, but the replicated parameters (biases, norm weights) keep
    their local gradients."""

    def finish_gradient_synchronization(self):
        replicated, self._replicated = self._replicated, []  # BUG: skips them
        try:
            super().finish_gradient_synchronization()
        finally:
            self._replicated = replicated


class NoSyncDroppedFSDP(FSDP):
    """Inside ``no_sync()`` the sharded parameters' gradients are dropped instead of kept."""

    def _reduce_gradient(self, entry, grad_full):
        if not self._sync:
            return None  # BUG: nothing kept for the next synchronised backward
        return super()._reduce_gradient(entry, grad_full)


class AccumulationOverwritesFSDP(FSDP):
    """Each reduce-scatter writes the shard's gradient instead of adding to it: accumulating
    without ``no_sync()`` keeps only the last micro-batch's gradient."""

    def _reduce_gradient(self, entry, grad_full):
        reduced = super()._reduce_gradient(entry, grad_full)
        if reduced is not None:
            entry.shard.grad = reduced.clone()  # BUG: overwrites what earlier backwards left
        return None


class NoInitialBroadcastFSDP(FSDP):
    """Shards each rank's own initial parameters: with different initial weights per rank, the
    gathered parameters are a mixture."""

    def __init__(self, module, compute_dtype=None):
        broadcast = dist.broadcast
        dist.broadcast = lambda *a, **k: None  # BUG: no broadcast from rank 0
        try:
            super().__init__(module, compute_dtype)
        finally:
            dist.broadcast = broadcast


class FreedBeforeBackwardFSDP(FSDP):
    """Frees each gathered parameter when its module's forward returns, but keeps no way to gather
    it again: backward reads freed storage."""

    def _release(self, owner, args, output):
        for name, _ in self._by_module[owner]:
            owner.__dict__.pop(name).untyped_storage().resize_(0)  # BUG: autograd saved it

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)  # BUG: no saved-tensor hooks to gather it again
