"""Broken fully sharded wrappers (the ``fsdp`` kind): each is ``paracheck.fsdp.FSDP`` with one bug
of the kind FSDP and ZeRO-3 implementations are reported with."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

from paracheck.fsdp import FSDP, _all_gather_into_tensor, _reduce_scatter_tensor, _Sharded

__all__ = [
    "AccumulationOverwritesFSDP",
    "AllGatherNotWaitedFSDP",
    "CachedGatherFSDP",
    "CastAfterGatherFSDP",
    "GatheredNeverFreedFSDP",
    "LowPrecisionGradientsFSDP",
    "ReduceInNoSyncFSDP",
    "ReduceScatterNotWaitedFSDP",
    "ReversedChunksFSDP",
    "ShardOffsetFloorFSDP",
    "ShardsInComputeDtypeFSDP",
    "TiedReducedTwiceFSDP",
    "FreedBeforeBackwardFSDP",
    "NoDivideFSDP",
    "NoInitialBroadcastFSDP",
    "NoSyncDroppedFSDP",
    "PaddingAtFrontFSDP",
    "PrefetchBeyondDeclaredFSDP",
    "PrefetchNotWaitedFSDP",
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


class TiedReducedTwiceFSDP(FSDP):
    """Reduce-scatters a gradient at every use of its parameter: a tied weight used twice is
    reduced twice per backward (right values, twice its traffic)."""

    def _reduce_gradient(self, entry, grad_full):
        entry.uses = 0  # BUG: no waiting for the last use's gradient
        return super()._reduce_gradient(entry, grad_full)


class ReduceInNoSyncFSDP(FSDP):
    """Reduce-scatters every backward's gradients, inside ``no_sync()`` too: the shards accumulate
    the right sums, and ``no_sync()`` saves nothing."""

    def _reduce_gradient(self, entry, grad_full):
        sync, self._sync = self._sync, True  # BUG: communicates inside no_sync()
        try:
            return super()._reduce_gradient(entry, grad_full)
        finally:
            self._sync = sync


class GatheredNeverFreedFSDP(FSDP):
    """Keeps a reference to every module's gathered parameters after its forward: the values are
    right, and every rank holds the whole model between steps."""

    def _release(self, owner, args, output):
        kept = self.__dict__.setdefault("_kept", {})
        kept[owner] = [owner.__dict__[name] for name, _ in self._by_module[owner]]  # BUG
        super()._release(owner, args, output)


class CachedGatherFSDP(FSDP):
    """Gathers each parameter once and reuses the whole tensor in later forwards: after the first
    optimizer step the forward runs on stale weights."""

    def _all_gather(self, entry):
        cache = self.__dict__.setdefault("_cache", {})
        if entry.index not in cache:
            cache[entry.index] = super()._all_gather(entry)
        return cache[entry.index]  # BUG: never gathered again after the shards change


class ReversedChunksFSDP(FSDP):
    """Builds the reduce-scatter input with the ranks' chunks in reverse order: rank r receives
    the summed gradient of rank W - 1 - r's elements."""

    def _reduce_scatter(self, entry, grad):
        c, W = entry.shard.numel(), self.world_size
        padded = torch.zeros(c * W, dtype=grad.dtype, device=grad.device)
        padded[: entry.numel] = grad
        padded = padded.view(W, c).flip(0).reshape(-1)  # BUG: chunk r is rank W-1-r's
        out = torch.empty(c, dtype=grad.dtype, device=grad.device)
        _reduce_scatter_tensor(out, padded, op=dist.ReduceOp.SUM)
        return out.div_(W)


class ShardOffsetFloorFSDP(FSDP):
    """Rank r's shard starts at ``r * (numel // W)`` while the layout pads to ``ceil(numel / W)``
    per rank: where ``numel % W != 0`` the shards overlap and the last elements are lost."""

    def _shard(self, index, p):
        entry = super()._shard(index, p)
        floor, c = p.numel() // self.world_size, math.ceil(p.numel() / self.world_size)
        start = self.rank * floor  # BUG: the start of an unpadded, floor-sized chunk
        have = p.detach().reshape(-1)[start : min(start + c, p.numel())]
        with torch.no_grad():
            entry.shard.zero_()
            entry.shard[: have.numel()] = have
        return entry


class AllGatherNotWaitedFSDP(FSDP):
    """Issues every all-gather asynchronously and never waits for it: the whole tensor is read
    while the ranks' shards are still arriving."""

    def _gather_padded(self, shard):
        padded = torch.empty(
            shard.numel() * self.world_size, dtype=shard.dtype, device=shard.device
        )
        _all_gather_into_tensor(padded, shard, async_op=True)  # BUG: the work is never waited on
        return padded


class CastAfterGatherFSDP(FSDP):
    """All-gathers the float32 shards and casts the whole parameter to the compute dtype after:
    the same values, twice the bytes on the wire and in the gathered layer."""

    def _to_send(self, entry):
        return entry.shard.detach()  # BUG: the float32 shard goes out

    def _all_gather(self, entry):
        full = super()._all_gather(entry)
        return full if self.compute_dtype is None else full.to(self.compute_dtype)  # cast after


class LowPrecisionGradientsFSDP(FSDP):
    """Leaves each full gradient in the compute dtype: the uses, the micro-batches and the ranks
    are summed in bfloat16, though the class declares a float32 reduction."""

    def _upcast(self, entry, grad):
        return grad  # BUG: no upcast before the sums


class ShardsInComputeDtypeFSDP(FSDP):
    """Casts the module to the compute dtype, then shards it: the optimizer steps bfloat16
    shards, so the float32 masters are gone and a small update is rounded away."""

    def __init__(self, module, compute_dtype=None):
        if compute_dtype is not None:
            module = module.to(compute_dtype)  # BUG: the masters are rounded
        super().__init__(module, compute_dtype)


class ReduceScatterNotWaitedFSDP(FSDP):
    """Issues every reduce-scatter asynchronously and never waits for it: the shard's gradient is
    divided and handed to autograd while the other ranks' contributions are still arriving."""

    def _reduce_scatter(self, entry, grad):
        c, W = entry.shard.numel(), self.world_size
        padded = torch.zeros(c * W, dtype=grad.dtype, device=grad.device)
        padded[: entry.numel] = grad
        out = torch.empty(c, dtype=grad.dtype, device=grad.device)
        _reduce_scatter_tensor(out, padded, op=dist.ReduceOp.SUM, async_op=True)  # BUG: no wait
        return out.div_(W).to(entry.shard.dtype)


class OverlapNotWaitedFSDP(FSDP):
    """Overlaps each reduce-scatter with the next module's backward: the shard's gradient is
    added when the next gradient is reduced (the last one's at the end of backward, waited), but
    the overlapped ones are never waited on. Right whenever a reduce-scatter finishes within one
    module's backward, which it usually does when no rank is late."""

    def __init__(self, module, *args, **kwargs):
        self._overlapped = None
        super().__init__(module, *args, **kwargs)

    def _add_overlapped(self, wait: bool) -> None:
        if self._overlapped is None:
            return
        entry, out, work = self._overlapped
        self._overlapped = None
        if wait:
            work.wait()
        g = out.div(self.world_size).to(entry.shard.dtype)
        entry.shard.grad = g if entry.shard.grad is None else entry.shard.grad.add_(g)

    def _reduce_scatter(self, entry, grad):
        self._add_overlapped(wait=False)  # BUG: the previous module's reduce-scatter is not waited
        c, W = entry.shard.numel(), self.world_size
        padded = torch.zeros(c * W, dtype=grad.dtype, device=grad.device)
        padded[: entry.numel] = grad
        out = torch.empty(c, dtype=grad.dtype, device=grad.device)
        work = _reduce_scatter_tensor(out, padded, op=dist.ReduceOp.SUM, async_op=True)
        self._overlapped = (entry, out, work)
        return torch.zeros_like(entry.shard)

    def finish_gradient_synchronization(self) -> None:
        super().finish_gradient_synchronization()
        self._add_overlapped(wait=True)


class ShardIsAViewFSDP(FSDP):
    """Each shard is this rank's slice of a padded copy of the whole parameter, a view: the
    values are right and every rank keeps the whole parameter's storage alive behind its shard."""

    def _shard(self, index, p):
        c = -(-p.numel() // self.world_size)
        full = torch.zeros(c * self.world_size, dtype=p.dtype, device=p.device)
        full[: p.numel()] = p.detach().reshape(-1)
        chunk = full[self.rank * c : (self.rank + 1) * c]  # BUG: a view, not a copy
        entry = _Sharded(index, nn.Parameter(chunk), p.shape, p.numel())
        self._entries.append(entry)
        return entry


class PrefetchBeyondDeclaredFSDP(FSDP):
    """Gathers one module call further ahead than its ``prefetch``: right values, one more
    module's parameters alive at once than the memory it was sized for."""

    def _prefetch_after(self, position):
        self.prefetch += 1  # BUG: the window is one call too long
        try:
            super()._prefetch_after(position)
        finally:
            self.prefetch -= 1


class PrefetchNotWaitedFSDP(FSDP):
    """Uses a prefetched parameter without waiting on its all-gather: the module computes with
    whatever of the other ranks' shards has arrived."""

    def _all_gather(self, entry):
        ahead = self._prefetched.pop(entry.index, None)
        if ahead is not None:
            return ahead[1][: entry.numel].view(entry.shape)  # BUG: its work is never waited on
        return super()._all_gather(entry)
