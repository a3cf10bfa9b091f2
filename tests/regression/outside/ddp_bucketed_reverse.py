"""Bucketed DDP: buckets filled greedily in reverse registration order, one
flat buffer per bucket (per dtype), a bucket launched (async) when all of its
parameters' gradients are ready (counted in post-accumulate hooks), buckets
launched strictly in bucket order so ranks issue the same collectives, and
unflattened into .grad in finish_gradient_synchronization().

The whole .grad is reduced (after the previous finish it is identical on every
rank, so avg(base + g_r) = base + avg(g_r): accumulation and no_sync compose).
Each bucket carries one presence flag per parameter so .grad stays None only
where no rank had one.  If a second backward happens in the same window
(finish once after k backwards / retain_graph), the window is redone in finish
from the full .grad (a MAX all-reduce of a 'redo' flag keeps ranks agreeing).
"""

import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn


class DDP(nn.Module):
    def __init__(self, module: nn.Module, bucket_size_mb=25.0):
        super().__init__()
        self.module = module
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self._sync = True
        with torch.no_grad():
            if self.world > 1:
                for t in list(module.parameters()) + list(module.buffers()):
                    dist.broadcast(t.data, src=0)
        params = [p for p in module.parameters() if p.requires_grad]
        cap = float("inf") if bucket_size_mb is None else bucket_size_mb * 1024 * 1024
        # greedy, reverse registration order, one open bucket per dtype
        self.buckets = []  # list of lists of params
        open_bucket = {}  # dtype -> (bucket index, bytes)
        for p in reversed(params):
            nbytes = p.numel() * p.element_size()
            cur = open_bucket.get(p.dtype)
            if cur is not None and cur[1] + nbytes <= cap:
                self.buckets[cur[0]].append(p)
                open_bucket[p.dtype] = (cur[0], cur[1] + nbytes)
            else:
                self.buckets.append([p])
                open_bucket[p.dtype] = (len(self.buckets) - 1, nbytes)
        self._where = {}
        for b, ps in enumerate(self.buckets):
            for p in ps:
                self._where[p] = b
        nb = len(self.buckets)
        self._count = [0] * nb
        self._seen = set()
        self._next = 0
        self._inflight = [None] * nb  # (work, flat)
        self._redo = False
        for p in params:
            p.register_post_accumulate_grad_hook(self._hook)

    def _flatten(self, b):
        ps = self.buckets[b]
        dtype = ps[0].dtype
        parts = []
        for p in ps:
            if p.grad is None:
                parts.append(torch.zeros(p.numel(), dtype=dtype))
            else:
                parts.append(p.grad.detach().reshape(-1).to(dtype))
        flags = torch.tensor([0.0 if p.grad is None else 1.0 for p in ps], dtype=dtype)
        return torch.cat(parts + [flags])

    def _launch(self, b):
        flat = self._flatten(b)
        work = dist.all_reduce(flat, async_op=True) if self.world > 1 else None
        self._inflight[b] = (work, flat)

    def _hook(self, p):
        if not self._sync:
            return
        if p in self._seen:  # second backward in this window
            self._redo = True
            return
        self._seen.add(p)
        b = self._where[p]
        self._count[b] += 1
        while self._next < len(self.buckets) and self._count[self._next] == len(
            self.buckets[self._next]
        ):
            self._launch(self._next)
            self._next += 1

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        old = self._sync
        self._sync = False
        try:
            yield
        finally:
            self._sync = old

    def finish_gradient_synchronization(self):
        nb = len(self.buckets)
        while self._next < nb:  # buckets with a locally unused param
            self._launch(self._next)
            self._next += 1
        redo = torch.tensor([1.0 if self._redo else 0.0])
        if self.world > 1:
            dist.all_reduce(redo, op=dist.ReduceOp.MAX)
        for b in range(nb):
            work, flat = self._inflight[b]
            if work is not None:
                work.wait()
        if redo.item() > 0:  # redo from the full .grad, synchronously
            for b in range(nb):
                self._launch(b)
                work, _ = self._inflight[b]
                if work is not None:
                    work.wait()
        with torch.no_grad():
            for b, ps in enumerate(self.buckets):
                _, flat = self._inflight[b]
                off = 0
                nflag = flat.numel() - len(ps)
                for j, p in enumerate(ps):
                    n = p.numel()
                    if flat[nflag + j].item() > 0:
                        avg = (flat[off : off + n] / self.world).view_as(p).to(p.dtype)
                        if p.grad is None:
                            p.grad = avg.clone()
                        else:
                            p.grad.copy_(avg)
                    off += n
        self._count = [0] * nb
        self._seen = set()
        self._next = 0
        self._inflight = [None] * nb
        self._redo = False
