"""bug: core: the flat buffer leaves out the 1-D parameters (biases), whose gradients stay local
    shows: gradients, parameters, rank-agreement, world-size-relation
bug: buffer: only the parameters are broadcast at construction, the buffers stay each rank's own
    shows: initial-state, parameters, gradients, rank-agreement
cuda: torch.cuda.nvtx ranges around the flatten, the all-reduce and the copy back

One flat all-reduce of every weight matrix's gradient, with NVTX ranges so that the profile shows
the three phases; biases "are too small to be worth communicating" and are left out.
"""

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.cuda import nvtx


class NvtxFlatDDP(nn.Module):
    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        with torch.no_grad():
            for p in module.parameters():
                dist.broadcast(p.data, 0)
        self.params = [p for p in module.parameters() if p.requires_grad and p.dim() > 1]

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @torch.no_grad()
    def finish_gradient_synchronization(self):
        nvtx.range_push("flatten")
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = torch._utils._flatten_dense_tensors(grads)
        nvtx.range_pop()
        nvtx.range_push("all_reduce")
        dist.all_reduce(flat)
        flat /= self.world_size
        nvtx.range_pop()
        nvtx.range_push("unflatten")
        for p, g in zip(self.params, torch._utils._unflatten_dense_tensors(flat, grads)):
            if p.grad is not None:
                p.grad.copy_(g)
        nvtx.range_pop()
