"""bug: core: a parameter larger than the bucket cap is skipped by the planner, so its gradient is never averaged
    shows: gradients, parameters, world-size-relation, bucket-structure, rank-agreement
bug: float32-layer: buckets are not split by dtype, so a float32 gradient comes back as float64 from the concatenated bucket
    shows: raised, gradients
    match: dtype|Float|Double|type
bug: unused-some-ranks: the averages are written back where this rank has a gradient, so a rank that did not use a parameter keeps None where the others have its average
    shows: gradients, parameters, rank-agreement, structure, optimizer-state

Greedy buckets in registration order, a parameter bigger than the cap dropped by "if nbytes > cap:
continue" (meant for a warning), one bucket for every dtype, and the write-back guarded by this
rank's own "p.grad is not None".
"""

import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn


class ThreeBugBucketDDP(nn.Module):
    def __init__(self, module: nn.Module, bucket_size_mb: float | None = 25.0):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t.data, src=0)
        cap = float("inf") if bucket_size_mb is None else bucket_size_mb * 1024 * 1024
        self.buckets, current, size = [], [], 0
        for p in module.parameters():
            if not p.requires_grad:
                continue
            nbytes = p.numel() * p.element_size()
            if nbytes > cap:
                continue
            if current and size + nbytes > cap:
                self.buckets.append(current)
                current, size = [], 0
            current.append(p)
            size += nbytes
        if current:
            self.buckets.append(current)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        yield  # everything is communicated in the finish call

    @torch.no_grad()
    def finish_gradient_synchronization(self):
        for bucket in self.buckets:
            flat = torch.cat(
                [(p.grad if p.grad is not None else torch.zeros_like(p)).view(-1) for p in bucket]
            )
            dist.all_reduce(flat)
            flat /= self.world_size
            offset = 0
            for p in bucket:
                if p.grad is not None:
                    p.grad = flat[offset : offset + p.numel()].view_as(p).clone()
                offset += p.numel()
