r"""bug: core: each rank's gradient is weighted by its share of the global batch, but the loss is already a mean per rank, so unequal batches are averaged wrongly
    shows: gradients, parameters, world-size-relation, rank-agreement
    match: max \|got - expected\| = [0-9.]+e(\+|-0[0-4])
bug: core: the flat buffer is torch.zeros(n) (float32 by default), so float64 gradients lose their precision on the way
    shows: float64-bound, gradients, parameters
    match: exact \(float64\)|max \|got - expected\| = [0-9.]+e-(0[5-9]|1[0-9])
bug: unused-always: a parameter no rank used gets a zero gradient, so momentum and weight decay move it
    shows: gradients, parameters, optimizer-state, structure

A "sample-weighted" flat DDP: forward() remembers the local batch size, the finish call
all-reduces it with the gradients (the last slot of the buffer) and scales each rank's gradient
by its local share before the sum, prints the global batch on rank 0 once, and writes every
slice back as the parameter's new gradient.
"""

import torch
import torch.distributed as dist
import torch.nn as nn


class BatchWeightedDDP(nn.Module):
    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t.data, src=0)
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.total = sum(p.numel() for p in self.params)
        self.local_batch = 0
        self.printed = False

    def forward(self, x, *args, **kwargs):
        self.local_batch = x.shape[0]
        return self.module(x, *args, **kwargs)

    @torch.no_grad()
    def finish_gradient_synchronization(self):
        if not self.params:
            return
        flat = torch.zeros(self.total + 1)
        offset = 0
        for p in self.params:
            if p.grad is not None:
                flat[offset : offset + p.numel()] = p.grad.reshape(-1) * self.local_batch
            offset += p.numel()
        flat[-1] = self.local_batch
        dist.all_reduce(flat)
        global_batch = flat[-1].item()
        if dist.get_rank() == 0 and not self.printed:
            print(f"global batch: {global_batch:.0f}")
            self.printed = True
        offset = 0
        for p in self.params:
            part = flat[offset : offset + p.numel()].view_as(p) / global_batch
            p.grad = part.to(p.dtype).clone()
            offset += p.numel()
