"""bug: core: each gradient is divided by the world size in the hook and again after the wait
    shows: gradients, parameters, world-size-relation
bug: unused-some-ranks: a parameter whose hook did not fire on this rank is never all-reduced
    shows: hang, died, raised
cuda: torch.cuda.synchronize() and torch.cuda.Event timing around the wait, on every device

Per-parameter hooks that launch an async all-reduce and keep the handles in a list, the way the
handout's "overlap" exercise is usually written, with the communication timed by CUDA events
for the benchmark and printed on rank 0.
"""

import time

import torch
import torch.distributed as dist
import torch.nn as nn


class HandlesTimedDDP(nn.Module):
    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        with torch.no_grad():
            for p in module.parameters():
                dist.broadcast(p.data, src=0)
            for b in module.buffers():
                dist.broadcast(b.data, src=0)
        self.handles = []
        self.comm_ms = []
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._hook)

    def _hook(self, param):
        param.grad.div_(self.world_size)
        self.handles.append((param, dist.all_reduce(param.grad, async_op=True)))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        for param, handle in self.handles:
            handle.wait()
            param.grad.div_(self.world_size)
        end.record()
        torch.cuda.synchronize()
        self.comm_ms.append(start.elapsed_time(end))
        if dist.get_rank() == 0 and len(self.comm_ms) % 100 == 0:
            print(f"comm {self.comm_ms[-1]:.2f} ms (wall {1e3 * (time.perf_counter() - t0):.2f})")
        self.handles.clear()
