"""bug: core: nothing is broadcast at construction, so ranks that build different weights never agree
    shows: initial-state, parameters, rank-agreement, gradients
bug: float32-layer: one flat buffer in the first parameter's dtype, written back into every .grad as it is
    shows: raised, gradients, parameters

"Every rank seeds the same generator", so the constructor communicates nothing; the finish call
flattens every gradient into one buffer of the first parameter's dtype and assigns the slices
back as new .grad tensors.
"""

import torch
import torch.distributed as dist
import torch.nn as nn


class OneDtypeNoInitDDP(nn.Module):
    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        self.params = [p for p in module.parameters() if p.requires_grad]

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @torch.no_grad()
    def finish_gradient_synchronization(self):
        if not self.params:
            return
        dtype = self.params[0].dtype
        flags = torch.tensor([float(p.grad is not None) for p in self.params], dtype=dtype)
        grads = [
            (p.grad if p.grad is not None else torch.zeros_like(p)).to(dtype).view(-1)
            for p in self.params
        ]
        flat = torch.cat(grads + [flags])
        dist.all_reduce(flat)
        offset = 0
        for p, present in zip(self.params, flat[-len(self.params) :].tolist()):
            n = p.numel()
            if present:
                p.grad = (flat[offset : offset + n] / self.world_size).view(p.shape)
            offset += n
