"""bug: unused-always: a parameter with no gradient on any rank gets a zero gradient instead of None

Missing gradients are reduced as zeros (so the collectives match), but every parameter is given
the result, so a parameter nobody used is stepped (weight decay, momentum, Adam state) where
single-process training skips it.
"""

import torch
import torch.distributed as dist
import torch.nn as nn


class ZerosForNoneDDP(nn.Module):
    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t.data, src=0)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @torch.no_grad()
    def finish_gradient_synchronization(self):
        for p in self.module.parameters():
            if not p.requires_grad:
                continue
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad)
            p.grad /= self.world_size
