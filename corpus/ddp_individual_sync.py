"""correct

Individual-parameter DDP, synchronous: finish_gradient_synchronization() all-reduces one tensor
of presence flags, then every trainable parameter's gradient on its own, in registration order
(zeros where this rank has none), and divides by the world size. Not an nn.Module: an object with
forward() and __call__.
"""

import torch
import torch.distributed as dist


class IndividualSyncDDP:
    def __init__(self, module):
        self.module = module
        self.world_size = dist.get_world_size()
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t.data, src=0)

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _average(self, summed):
        return summed / self.world_size

    @torch.no_grad()
    def finish_gradient_synchronization(self):
        params = [p for p in self.module.parameters() if p.requires_grad]
        if not params:
            return
        present = torch.tensor([1.0 if p.grad is not None else 0.0 for p in params])
        dist.all_reduce(present)
        for p, count in zip(params, present.tolist()):
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            g = g.detach().clone()
            dist.all_reduce(g)
            if count > 0:
                p.grad = self._average(g)
