"""A DDP written the way the CS336 handout's interface reads: broadcast the module's parameters and
buffers from rank 0 at construction; in ``finish_gradient_synchronization()``, all-reduce and
average every gradient that is not None. Correct for every case the CS336 interface covers (every
rank has a gradient for the same parameters); where a parameter is used on some ranks only, the
ranks disagree on what to all-reduce."""

import torch.distributed as dist
from torch import nn


class GradNotNoneDDP(nn.Module):
    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        for t in [*module.parameters(), *module.buffers()]:
            dist.broadcast(t.data, src=0)

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    def finish_gradient_synchronization(self) -> None:
        for p in self.module.parameters():
            if p.requires_grad and p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad.div_(self.world_size)
