"""correct

Bucketed DDP with torch's reading of the cap: buckets filled in reverse registration order (the
order gradients become ready), a bucket closed as soon as it reaches bucket_size_mb with the
parameter that took it there, one bucket list per dtype. finish_gradient_synchronization()
launches every bucket's all-reduce asynchronously (the presence flags of its parameters at the end
of the bucket), then waits on each in launch order and unflattens.
"""

import torch
import torch.distributed as dist
import torch.nn as nn


class TorchCapDDP(nn.Module):
    def __init__(self, module, bucket_size_mb=25.0):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t.data, src=0)
        cap = None if bucket_size_mb is None else int(bucket_size_mb * 1024 * 1024)
        open_buckets, self.buckets = {}, []
        for p in reversed([p for p in module.parameters() if p.requires_grad]):
            bucket = open_buckets.setdefault(p.dtype, [])
            bucket.append(p)
            if cap is not None and sum(q.numel() * q.element_size() for q in bucket) >= cap:
                self.buckets.append(bucket)
                open_buckets[p.dtype] = []
        self.buckets += [b for b in open_buckets.values() if b]

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @torch.no_grad()
    def finish_gradient_synchronization(self):
        pending = []
        for bucket in self.buckets:
            parts = [
                (p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in bucket
            ]
            flags = torch.tensor([p.grad is not None for p in bucket], dtype=bucket[0].dtype)
            flat = torch.cat(parts + [flags])
            pending.append((bucket, flat, dist.all_reduce(flat, async_op=True)))
        for bucket, flat, work in pending:
            work.wait()
            flags = flat[-len(bucket) :]
            offset = 0
            for p, flag in zip(bucket, flags.tolist()):
                if flag > 0:
                    p.grad = (
                        (flat[offset : offset + p.numel()] / self.world_size).view_as(p).clone()
                    )
                offset += p.numel()
