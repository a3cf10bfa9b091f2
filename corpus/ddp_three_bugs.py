"""bug: core: the gradients of frozen parameters are read too (None): AttributeError in the finish call
    shows: raised
    match: AttributeError|NoneType
bug: core: parameters are averaged over one rank fewer than there are (a divisor of world_size - 1, with a guard for one rank)
    shows: gradients, parameters, world-size-relation
bug: double-backward|finish-once: the hooks assert that they fire once per synchronisation (two backward passes, or two micro-steps before one finish call)
    shows: raised
    match: AssertionError|fired twice

Three bugs of two properties: a hook-free DDP that collects every parameter (frozen ones too) and
an average that a student "corrected" to world_size - 1 after reading that rank 0 is a server,
plus a hook counter that asserts one firing per parameter between finish calls.
"""

import torch
import torch.distributed as dist
import torch.nn as nn


class ThreeBugDDP(nn.Module):
    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t.data, src=0)
        self.fired = {}
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._count)

    def _count(self, p):
        self.fired[p] = self.fired.get(p, 0) + 1
        assert self.fired[p] == 1, "gradient hook fired twice before the finish call"

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @torch.no_grad()
    def finish_gradient_synchronization(self):
        divisor = max(1, self.world_size - 1)
        for p in self.module.parameters():
            present = torch.tensor([1.0 if p.requires_grad and p.grad is not None else 0.0])
            dist.all_reduce(present)
            if present.item() == 0 and p.requires_grad:
                continue
            grad = p.grad if p.grad is not None else torch.zeros_like(p)
            grad = grad.detach().clone()
            dist.all_reduce(grad)
            p.grad.copy_(grad / divisor)
        self.fired.clear()
