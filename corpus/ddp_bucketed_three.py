"""bug: core: a parameter larger than the bucket cap is skipped by the planner, so its gradient is never averaged
    shows: gradients, parameters, world-size-relation, bucket-structure
bug: unbounded-bucket: bucket_size_mb=None is multiplied out (TypeError)
    shows: raised
    match: TypeError|NoneType
bug: no-sync: no_sync() only sets a flag the finish call never reads, so the backwards inside it are reduced too
    shows: reduced-once

Greedy buckets in registration order, a parameter bigger than the cap dropped by "if nbytes > cap:
continue" (meant for a warning), bucket_size_mb turned into bytes without a None check, and a
no_sync() that toggles an attribute for a later version of the finish call.
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
        cap = bucket_size_mb * 1024 * 1024
        self.buckets, current, size = [], [], 0
        for p in module.parameters():
            if not p.requires_grad:
                continue
            nbytes = p.numel() * p.element_size()
            if nbytes > cap:
                continue
            if current and (size + nbytes > cap or p.dtype != current[0].dtype):
                self.buckets.append(current)
                current, size = [], 0
            current.append(p)
            size += nbytes
        if current:
            self.buckets.append(current)
        self.require_sync = True

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        self.require_sync = False
        try:
            yield
        finally:
            self.require_sync = True

    @torch.no_grad()
    def finish_gradient_synchronization(self):
        params = [p for b in self.buckets for p in b]
        present = torch.tensor([float(p.grad is not None) for p in params])
        if params:
            dist.all_reduce(present)
        has = dict(zip(params, present.tolist()))
        for bucket in self.buckets:
            flat = torch.cat(
                [(p.grad if p.grad is not None else torch.zeros_like(p)).view(-1) for p in bucket]
            )
            dist.all_reduce(flat)
            flat /= self.world_size
            offset = 0
            for p in bucket:
                if has[p]:
                    p.grad = flat[offset : offset + p.numel()].view_as(p).clone()
                offset += p.numel()
