"""bug: unused-some-ranks: each gradient is all-reduced in the order its hook fires on this rank

A post-accumulate-grad hook launches an async all-reduce per parameter as soon as its gradient is
ready; parameters without a gradient are reduced (as zeros) in the finish call. A parameter used
on some ranks only is launched in the middle of backward on those ranks and at the end on the
others, so the ranks pair different tensors.
"""

import torch
import torch.distributed as dist
import torch.nn as nn


class FireOrderDDP(nn.Module):
    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t.data, src=0)
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.inflight = {}
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._hook)

    def _hook(self, p):
        buf = p.grad.detach().clone()
        self.inflight[p] = (buf, dist.all_reduce(buf, async_op=True))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @torch.no_grad()
    def finish_gradient_synchronization(self):
        present = torch.tensor([float(p.grad is not None) for p in self.params])
        for p in self.params:
            if p not in self.inflight:
                buf = torch.zeros_like(p)
                self.inflight[p] = (buf, dist.all_reduce(buf, async_op=True))
        dist.all_reduce(present)
        for p, count in zip(self.params, present.tolist()):
            buf, work = self.inflight[p]
            work.wait()
            if count > 0:
                p.grad = buf / self.world_size
        self.inflight = {}
