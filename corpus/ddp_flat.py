"""correct

DDP with one flat all-reduce per dtype in finish_gradient_synchronization(): every trainable
gradient (zeros where this rank has none) and one presence flag per parameter, so a gradient no
rank produced stays None. Parameters and buffers are broadcast from rank 0 at construction. The
whole .grad is reduced, so accumulation, no_sync() (a context that only skips nothing: the
communication is in the finish call) and one finish after k backwards all compose.
"""

import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn


class FlatDDP(nn.Module):
    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        self._broadcast_initial(module)
        self.params = [p for p in module.parameters() if p.requires_grad]

    @torch.no_grad()
    def _broadcast_initial(self, module):
        for t in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(t.data, src=0)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        yield  # nothing is communicated before finish_gradient_synchronization()

    def _groups(self):
        by_dtype = {}
        for p in self.params:
            by_dtype.setdefault(p.dtype, []).append(p)
        return list(by_dtype.values())

    @torch.no_grad()
    def finish_gradient_synchronization(self):
        for params in self._groups():
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            flags = torch.tensor([p.grad is not None for p in params], dtype=params[0].dtype)
            flat = torch.cat([g.reshape(-1) for g in grads] + [flags])
            dist.all_reduce(flat)
            present = flat[-len(params) :]
            offset = 0
            for p, there in zip(params, present.tolist()):
                n = p.numel()
                avg = flat[offset : offset + n].view_as(p) / self.world_size
                offset += n
                if there:
                    p.grad = avg.clone()
