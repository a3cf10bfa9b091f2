"""bug: core: async all-reduces are launched and their handles never waited on

finish_gradient_synchronization() launches one async all-reduce per gradient and divides right
away, reading tensors the reduction may not have written yet.
"""

import torch
import torch.distributed as dist
import torch.nn as nn


class NoWaitDDP(nn.Module):
    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t.data, src=0)
        self.handles = []

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @torch.no_grad()
    def finish_gradient_synchronization(self):
        params = [p for p in self.module.parameters() if p.requires_grad]
        present = torch.tensor([float(p.grad is not None) for p in params])
        dist.all_reduce(present)
        results = []
        for p in params:
            g = (p.grad if p.grad is not None else torch.zeros_like(p)).detach().clone()
            self.handles.append(dist.all_reduce(g, async_op=True))
            results.append(g)
        for p, g, count in zip(params, results, present.tolist()):
            if count > 0:
                p.grad = g / self.world_size
