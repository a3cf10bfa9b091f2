"""correct

Flat DDP timed the careful way: CUDA events only when CUDA is available (time.perf_counter()
otherwise), the time printed on rank 0 every 100 calls. Per dtype, one flat all-reduce of every
trainable gradient (zeros where this rank has none) followed by one presence flag per parameter,
so a parameter no rank used stays without a gradient. Parameters and buffers are broadcast from
rank 0 at construction; the whole .grad is averaged, so accumulation and several backwards per
finish compose.
"""

import time

import torch
import torch.distributed as dist
import torch.nn as nn


class GuardedTimedFlatDDP(nn.Module):
    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t.data, src=0)
        self.by_dtype = {}
        for p in module.parameters():
            if p.requires_grad:
                self.by_dtype.setdefault(p.dtype, []).append(p)
        self.calls = 0
        self.comm_ms = 0.0

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _timer(self):
        if torch.cuda.is_available():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()

            def stop():
                end.record()
                torch.cuda.synchronize()
                return start.elapsed_time(end)

            return stop
        t0 = time.perf_counter()
        return lambda: 1e3 * (time.perf_counter() - t0)

    @torch.no_grad()
    def finish_gradient_synchronization(self):
        stop = self._timer()
        for params in self.by_dtype.values():
            parts = [
                (p.grad if p.grad is not None else torch.zeros_like(p)).view(-1) for p in params
            ]
            flags = torch.tensor([float(p.grad is not None) for p in params], dtype=params[0].dtype)
            flat = torch.cat(parts + [flags])
            dist.all_reduce(flat)
            offset = 0
            for p, seen in zip(params, flat[-len(params) :].tolist()):
                if seen:
                    p.grad = (
                        (flat[offset : offset + p.numel()] / self.world_size).view_as(p).clone()
                    )
                offset += p.numel()
        self.comm_ms += stop()
        self.calls += 1
        if dist.get_rank() == 0 and self.calls % 100 == 0:
            print(f"[ddp] {self.calls} syncs, {self.comm_ms / self.calls:.3f} ms each")
