"""correct

Individual-parameter DDP: a post-accumulate-grad hook per trainable parameter launches an async
all-reduce of that parameter's whole .grad, in a fixed order (reverse registration) so that every
rank issues the same collectives: a parameter is launched only once all parameters before it in
that order were. Parameters whose hook did not fire on this rank (unused here) are launched in
finish_gradient_synchronization() as zeros, and one flag tensor says which ranks had a gradient.
A hook firing twice in one window (several backwards before one finish, retain_graph) marks the
window for a redo; the ranks agree on the redo with a MAX all-reduce, and the redo all-reduces the
full .grad again.
"""

import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn


class IndividualAsyncDDP(nn.Module):
    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t.data, src=0)
        self.order = [p for p in module.parameters() if p.requires_grad][::-1]
        self.index = {p: i for i, p in enumerate(self.order)}
        self.syncing = True
        self._reset()
        for p in self.order:
            p.register_post_accumulate_grad_hook(self._hook)

    def _reset(self):
        self.ready = [False] * len(self.order)
        self.launched = []  # (param, buffer, work) in launch order
        self.redo = False

    def _launch(self, p):
        buf = (p.grad if p.grad is not None else torch.zeros_like(p)).detach().clone()
        self.launched.append((p, buf, dist.all_reduce(buf, async_op=True)))

    def _hook(self, p):
        if not self.syncing:
            return
        i = self.index[p]
        if self.ready[i]:
            self.redo = True
            return
        self.ready[i] = True
        while len(self.launched) < len(self.order) and self.ready[len(self.launched)]:
            self._launch(self.order[len(self.launched)])

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
        while len(self.launched) < len(self.order):
            self._launch(self.order[len(self.launched)])
        flags = torch.tensor([float(self.redo)] + [float(p.grad is not None) for p in self.order])
        dist.all_reduce(flags)
        for _, _, work in self.launched:
            work.wait()
        results = [buf for _, buf, _ in self.launched]
        if flags[0] > 0:
            results = []
            for p in self.order:
                buf = (p.grad if p.grad is not None else torch.zeros_like(p)).detach().clone()
                dist.all_reduce(buf)
                results.append(buf)
        for p, buf, present in zip(self.order, results, flags[1:].tolist()):
            if present:
                p.grad = (buf / self.world_size).to(p.dtype)
        self._reset()
