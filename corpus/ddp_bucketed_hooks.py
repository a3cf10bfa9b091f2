"""correct

Bucketed DDP that overlaps communication with backward: buckets filled greedily in reverse
registration order (a new bucket at a dtype change or when the next parameter would pass
bucket_size_mb), a bucket launched as an async all-reduce from the post-accumulate-grad hook that
completes it, but only after every earlier bucket, so every rank issues the same sequence. The
finish call launches the buckets whose parameters had no gradient here, all-reduces the presence
flags and a redo flag (set when a hook fires twice in one window: several backwards before one
finish), waits, redoes every bucket from the full .grad if any rank asked, and writes the averages.
"""

import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn


class HookBucketDDP(nn.Module):
    def __init__(self, module: nn.Module, bucket_size_mb: float | None = 25.0):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t.data, src=0)
        self.params = [p for p in module.parameters() if p.requires_grad]
        cap = float("inf") if bucket_size_mb is None else bucket_size_mb * 2**20
        self.buckets, size = [], 0
        for p in reversed(self.params):
            nbytes = p.numel() * p.element_size()
            last = self.buckets[-1] if self.buckets else None
            if last is None or last[0].dtype != p.dtype or size + nbytes > cap:
                self.buckets.append([p])
                size = nbytes
            else:
                last.append(p)
                size += nbytes
        self.bucket_of = {p: b for b, ps in enumerate(self.buckets) for p in ps}
        self.syncing = True
        self._reset()
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._hook)

    def _reset(self):
        self.left = [len(b) for b in self.buckets]
        self.fired = set()
        self.inflight = []
        self.redo = False

    def _launch(self, b):
        flat = torch.cat(
            [
                (p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1)
                for p in self.buckets[b]
            ]
        )
        self.inflight.append((flat, dist.all_reduce(flat, async_op=True)))

    def _hook(self, p):
        if not self.syncing:
            return
        if p in self.fired:
            self.redo = True
            return
        self.fired.add(p)
        self.left[self.bucket_of[p]] -= 1
        while len(self.inflight) < len(self.buckets) and self.left[len(self.inflight)] == 0:
            self._launch(len(self.inflight))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        self.syncing = False
        try:
            yield
        finally:
            self.syncing = True

    @torch.no_grad()
    def finish_gradient_synchronization(self):
        while len(self.inflight) < len(self.buckets):
            self._launch(len(self.inflight))
        flags = torch.tensor([float(self.redo)] + [float(p.grad is not None) for p in self.params])
        dist.all_reduce(flags)
        for _, work in self.inflight:
            work.wait()
        if flags[0] > 0:
            self.inflight = []
            for b in range(len(self.buckets)):
                self._launch(b)
                self.inflight[-1][1].wait()
        present = {p: f > 0 for p, f in zip(self.params, flags[1:].tolist())}
        for bucket, (flat, _) in zip(self.buckets, self.inflight):
            offset = 0
            for p in bucket:
                if present[p]:
                    p.grad = (flat[offset : offset + p.numel()] / self.world_size).view_as(p)
                offset += p.numel()
        self._reset()
