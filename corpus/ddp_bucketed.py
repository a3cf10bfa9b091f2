"""correct

Bucketed DDP, buckets filled greedily in registration order up to bucket_size_mb (a parameter
larger than the cap alone; a new bucket at every dtype change; None: one bucket per dtype). The
finish call all-reduces one presence-flag tensor, then every bucket synchronously as one flat
tensor, and writes the averages back into .grad.
"""

import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn


class BucketedDDP(nn.Module):
    def __init__(self, module: nn.Module, bucket_size_mb: float | None = 25.0):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t.data, src=0)
        self.params = [p for p in module.parameters() if p.requires_grad]
        cap = float("inf") if bucket_size_mb is None else bucket_size_mb * 1024 * 1024
        self.buckets = self._plan(self.params, cap)

    @staticmethod
    def _plan(params, cap):
        buckets, current, size = [], [], 0
        for p in params:
            nbytes = p.numel() * p.element_size()
            if current and (size + nbytes > cap or p.dtype != current[0].dtype):
                buckets.append(current)
                current, size = [], 0
            current.append(p)
            size += nbytes
        if current:
            buckets.append(current)
        return buckets

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        yield

    @torch.no_grad()
    def finish_gradient_synchronization(self):
        if not self.params:
            return
        present = torch.tensor([float(p.grad is not None) for p in self.params])
        dist.all_reduce(present)
        has = {p: bool(f) for p, f in zip(self.params, present.tolist())}
        for bucket in self.buckets:
            flat = torch.cat(
                [
                    (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                    for p in bucket
                ]
            )
            dist.all_reduce(flat)
            flat /= self.world_size
            offset = 0
            for p in bucket:
                if has[p]:
                    p.grad = flat[offset : offset + p.numel()].view_as(p).clone()
                offset += p.numel()
