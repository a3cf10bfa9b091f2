"""A broken bucketed DDP written outside paracheck: each bucket counts the hooks that fired and is
launched when the count reaches its size, resetting the count; a bucket holding a parameter no
rank uses never reaches its size, so the finish call launches it and forgets to reset its count.
The next window launches that bucket at its first hook, before its other gradients are ready."""

import torch
import torch.distributed as dist
import torch.nn as nn


class CountingBucketDDP(nn.Module):
    def __init__(self, module: nn.Module, bucket_size_mb=None):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t.data, src=0)
        cap = float("inf") if bucket_size_mb is None else bucket_size_mb * 1024 * 1024
        params = [p for p in module.parameters() if p.requires_grad]
        self._buckets, cur, size = [], [], 0
        for p in reversed(params):
            nb = p.numel() * p.element_size()
            if cur and (size + nb > cap or p.dtype != cur[0].dtype):
                self._buckets.append(cur)
                cur, size = [], 0
            cur.append(p)
            size += nb
        if cur:
            self._buckets.append(cur)
        self._bucket_of = {}
        for bi, b in enumerate(self._buckets):
            for p in b:
                self._bucket_of[p] = bi
        self._count = [0] * len(self._buckets)
        self._work = [None] * len(self._buckets)
        for p in params:
            p.register_post_accumulate_grad_hook(self._hook)

    def _launch(self, bi):
        bucket = self._buckets[bi]
        with torch.no_grad():
            flat = torch.cat(
                [
                    (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                    for p in bucket
                ]
            )
        self._work[bi] = (flat, dist.all_reduce(flat, async_op=True))

    def _hook(self, p):
        bi = self._bucket_of[p]
        self._count[bi] += 1
        if self._count[bi] == len(self._buckets[bi]):
            self._count[bi] = 0
            self._launch(bi)

    def forward(self, *a, **k):
        return self.module(*a, **k)

    @torch.no_grad()
    def finish_gradient_synchronization(self):
        for bi in range(len(self._buckets)):
            if self._work[bi] is None:
                self._launch(bi)  # partial bucket (an unused parameter): count not reset
        for bi, (flat, work) in enumerate(self._work):
            work.wait()
            flat.div_(self.world_size)
            off = 0
            for p in self._buckets[bi]:
                if p.grad is not None:
                    p.grad.copy_(flat[off : off + p.numel()].view_as(p))
                off += p.numel()
        self._work = [None] * len(self._buckets)
