"""correct

Bucketed DDP with NVTX ranges around each bucket's all-reduce, entered only when CUDA is
available (contextlib.nullcontext() otherwise). Buckets are filled in reverse registration order
(the order backward produces gradients) up to bucket_size_mb, a new one at every dtype change,
one bucket per dtype for None. The finish call all-reduces presence flags, then each bucket
asynchronously, waits for the handles in order and writes the averages back.
"""

import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn


def _range(name):
    if torch.cuda.is_available():
        return torch.cuda.nvtx.range(name)
    return contextlib.nullcontext()


class NvtxGuardedBucketDDP(nn.Module):
    def __init__(self, module: nn.Module, bucket_size_mb: float | None = 25.0):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t.data, src=0)
        self.params = [p for p in module.parameters() if p.requires_grad]
        limit = None if bucket_size_mb is None else bucket_size_mb * 1024 * 1024
        self.buckets, size = [], 0
        for p in reversed(self.params):
            nbytes = p.numel() * p.element_size()
            full = limit is not None and size + nbytes > limit
            if not self.buckets or full or p.dtype != self.buckets[-1][0].dtype:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(p)
            size += nbytes

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @torch.no_grad()
    def finish_gradient_synchronization(self):
        if not self.params:
            return
        flags = torch.tensor([float(p.grad is not None) for p in self.params])
        dist.all_reduce(flags)
        present = {p: f > 0 for p, f in zip(self.params, flags.tolist())}
        handles = []
        for i, bucket in enumerate(self.buckets):
            with _range(f"bucket {i}"):
                flat = torch.cat(
                    [
                        (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                        for p in bucket
                    ]
                )
                handles.append((bucket, flat, dist.all_reduce(flat, async_op=True)))
        for bucket, flat, handle in handles:
            handle.wait()
            flat.div_(self.world_size)
            offset = 0
            for p in bucket:
                if present[p]:
                    p.grad = flat[offset : offset + p.numel()].view_as(p).clone()
                offset += p.numel()
