"""bug: core: the all-reduced gradients are never divided by the world size (a sum, not a mean)
    shows: gradients, parameters, world-size-relation
bug: unused-some-ranks: parameters without a gradient on this rank are skipped (collectives differ by rank)
    shows: hang, died, raised

The two-line DDP: broadcast at construction, then "for p in params: if p.grad is None: continue;
all_reduce(p.grad)" in the finish call, with the division forgotten (SUM is all_reduce's
default).
"""

import torch.distributed as dist
import torch.nn as nn


class SkipNoneSumDDP(nn.Module):
    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        for t in module.state_dict().values():
            dist.broadcast(t, src=0)

    def forward(self, x):
        return self.module(x)

    def finish_gradient_synchronization(self):
        for p in self.module.parameters():
            if p.grad is None:
                continue
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
