"""correct

DDP that keeps each window's gradients aside: a tensor hook per trainable parameter adds each
backward's incoming gradient to a pending sum (inside no_sync() too) and lets only zeros reach
.grad, so .grad keeps the synchronised value of earlier windows, bitwise equal on every rank.
finish_gradient_synchronization() all-reduces the pending sums (one flat buffer per dtype, zeros
where this rank has none, a presence flag per parameter) and adds their average to .grad.
"""

import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn


class DeltaDDP(nn.Module):
    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t.data, src=0)
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.pending = {}
        self.syncing = True
        for p in self.params:
            p.register_hook(self._make_hook(p))

    def _make_hook(self, p):
        def hook(grad):
            return self._stash(p, grad)

        return hook

    def _stash(self, p, grad):
        """Keeps ``grad`` aside; returns what autograd adds to .grad."""
        if p in self.pending:
            self.pending[p] = self.pending[p] + grad.detach()
        else:
            self.pending[p] = grad.detach().clone()
        return torch.zeros_like(grad)

    def _clear_pending(self):
        self.pending = {}

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        self.syncing = False
        try:
            yield
        finally:
            self.syncing = True

    @torch.no_grad()
    def finish_gradient_synchronization(self):
        by_dtype = {}
        for p in self.params:
            by_dtype.setdefault(p.dtype, []).append(p)
        for params in by_dtype.values():
            mine = [self.pending.get(p, torch.zeros_like(p)) for p in params]
            flags = torch.tensor([p.grad is not None for p in params], dtype=params[0].dtype)
            flat = torch.cat([m.reshape(-1) for m in mine] + [flags])
            dist.all_reduce(flat)
            offset = 0
            for p, present in zip(params, flat[-len(params) :].tolist()):
                avg = flat[offset : offset + p.numel()].view_as(p) / self.world_size
                offset += p.numel()
                if present:
                    p.grad = avg.clone() if p.grad is None else p.grad + avg
        self._clear_pending()
