"""bug: unused-some-ranks: parameters without a gradient on this rank are skipped (collectives differ by rank)

The common loop "for p in params: if p.grad is not None: all_reduce(p.grad)": right while every
rank has the same gradients present, a hang or a mismatched reduction as soon as a parameter is
used on some ranks only.
"""

import torch
import torch.distributed as dist
import torch.nn as nn


class SkipNoneDDP(nn.Module):
    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        for t in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(t.data, src=0)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @torch.no_grad()
    def finish_gradient_synchronization(self):
        for p in self.module.parameters():
            if p.requires_grad and p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= self.world_size
