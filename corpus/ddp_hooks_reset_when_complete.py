"""bug: accumulation+unused-always|accumulation+unused-some-ranks: the hooks' state is reset only once every hook fired, so with a parameter unused the later micro-batches' gradients are never communicated (and with one used on some ranks only, the ranks' collectives differ)
    shows: gradients, parameters, world-size-relation, reduced-once, rank-agreement, hang, died
bug: double-backward|finish-once: a hook that fires again in one window is ignored, so the gradient of a second backward before the finish call is never communicated
    shows: gradients, parameters, world-size-relation, reduced-once

Per-parameter hooks, each launching an async all-reduce of a copy of its gradient the first time
it fires in a window. The finish call launches the parameters whose hooks did not fire (as
zeros, with presence flags, so that an unused parameter stays without a gradient) and, "to be
safe", resets the window only when every hook fired; otherwise the next forward that finds the
gradients cleared (None or zeros) resets it. Right for one backward per finish call, and for
accumulation with a finish call after each backward while every parameter is used.
"""

import torch
import torch.distributed as dist
import torch.nn as nn


class ResetWhenCompleteDDP(nn.Module):
    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t.data, src=0)
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.index = {p: i for i, p in enumerate(self.params)}
        self._reset()
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._hook)

    def _reset(self):
        self.fired = [False] * len(self.params)
        self.pending = {}  # index -> (buffer, handle)

    def _launch(self, i, grad):
        buf = grad.detach().clone() if grad is not None else torch.zeros_like(self.params[i])
        self.pending[i] = (buf, dist.all_reduce(buf, async_op=True))

    def _hook(self, p):
        i = self.index[p]
        if self.fired[i]:
            return  # already launched in this window
        self.fired[i] = True
        # Launch in index order so that every rank issues the same collectives.
        for j in range(len(self.params)):
            if j in self.pending:
                continue
            if not self.fired[j]:
                break
            self._launch(j, self.params[j].grad)

    def forward(self, *args, **kwargs):
        if all(p.grad is None or not p.grad.any() for p in self.params):
            self._reset()  # a new step: the optimizer cleared the gradients
        return self.module(*args, **kwargs)

    @torch.no_grad()
    def finish_gradient_synchronization(self):
        for j in range(len(self.params)):
            if j not in self.pending:
                self._launch(j, self.params[j].grad)
        flags = torch.tensor([float(p.grad is not None) for p in self.params])
        dist.all_reduce(flags)
        for j, p in enumerate(self.params):
            buf, handle = self.pending[j]
            handle.wait()
            if flags[j] > 0:
                p.grad = buf / self.world_size
        if all(self.fired):
            self._reset()
        else:
            self.pending = {j: (buf, _Done()) for j, (buf, _) in self.pending.items()}


class _Done:
    def wait(self):
        return True
