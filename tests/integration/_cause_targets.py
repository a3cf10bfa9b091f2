"""DDP targets with two bugs each, for the verdict table's causes (tests/integration/test_causes.py):
two exceptions, a core bug beside a feature's of the same property, a bug that needs two features
together, a bug behind another in every case, a bug behind a CUDA timing call; and a sharded
optimizer whose bug is behind a CUDA timing call."""

import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn


class SimpleDDP(nn.Module):
    """A correct DDP: parameters and buffers broadcast from rank 0, and one all-reduce per
    trainable parameter of its gradient (zeros where this rank has none) and a presence flag, so
    that a gradient no rank produced stays None."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t.data, src=0)
        self.params = [p for p in module.parameters() if p.requires_grad]

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        yield  # nothing is communicated before finish_gradient_synchronization()

    @torch.no_grad()
    def finish_gradient_synchronization(self):
        for p in self.params:
            grad = p.grad if p.grad is not None else torch.zeros_like(p)
            flag = (
                torch.ones(1, dtype=p.dtype)
                if p.grad is not None
                else torch.zeros(1, dtype=p.dtype)
            )
            buf = torch.cat([grad.reshape(-1), flag])
            dist.all_reduce(buf)
            if buf[-1].item() > 0:
                p.grad = self._average(buf[:-1]).view_as(p).clone()

    def _average(self, summed):
        return summed / self.world_size


class TwoRaisesDDP(SimpleDDP):
    """Raises a KeyError on two ranks and a RuntimeError on one: two bugs of one property."""

    def finish_gradient_synchronization(self):
        if self.world_size == 1:
            raise RuntimeError("planted: a single rank is not handled")
        if self.world_size == 2:
            raise KeyError("planted: two ranks")
        super().finish_gradient_synchronization()


class CoreAndAccumulationDDP(SimpleDDP):
    """Sums the gradients without dividing by the world size (a core bug, seen on two ranks) and
    clears the gradients at every forward (an accumulation bug: only the last micro-batch counts,
    on one rank too)."""

    def forward(self, *args, **kwargs):
        for p in self.params:
            p.grad = None  # BUG: the earlier micro-batches' gradients are dropped
        return self.module(*args, **kwargs)

    def _average(self, summed):
        return summed  # BUG: no division by the world size


class AccumulatedUnusedDDP(SimpleDDP):
    """Correct but in a micro-step after the first of an accumulation window (a forward that finds
    gradients already accumulated) over a parameter no rank used: then it gives that parameter a
    gradient of zeros (its .grad must stay None). Neither feature alone shows it."""

    _accumulating = False

    def forward(self, *args, **kwargs):
        if any(p.grad is not None and bool(p.grad.any()) for p in self.params):
            self._accumulating = True
        return self.module(*args, **kwargs)

    @torch.no_grad()
    def finish_gradient_synchronization(self):
        if self._accumulating:
            for p in self.params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)  # BUG: an unused parameter gets a gradient
        self._accumulating = False
        super().finish_gradient_synchronization()


class RoundedAndZerosForUnusedDDP(SimpleDDP):
    """Averages in float32 (a rounding on every float64 gradient, in every case) and gives a
    parameter no rank used a gradient of zeros (its .grad must stay None)."""

    @torch.no_grad()
    def finish_gradient_synchronization(self):
        super().finish_gradient_synchronization()
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)  # BUG: an unused parameter gets a gradient

    def _average(self, summed):
        return (summed.float() / self.world_size).to(summed.dtype)  # BUG: float32 on the way


class CudaTimedDDP(SimpleDDP):
    """Times its synchronisation with torch.cuda.synchronize() (which raises on a machine without
    CUDA) and sums the gradients without dividing by the world size."""

    def finish_gradient_synchronization(self):
        torch.cuda.synchronize()
        super().finish_gradient_synchronization()

    def _average(self, summed):
        return summed  # BUG: no division by the world size


class LocalFirstAndSummedBiasesDDP(SimpleDDP):
    """Leaves the first parameter's gradient local (it is never all-reduced) and sums each bias's
    gradient without dividing by the world size: two bugs in every case of two ranks, both
    diverging at the first step's gradients, the first parameter's first."""

    @torch.no_grad()
    def finish_gradient_synchronization(self):
        for i, p in enumerate(self.params):
            if i == 0 or p.grad is None:
                continue  # BUG: the first parameter's gradient is left local
            dist.all_reduce(p.grad)
            if p.dim() > 1:
                p.grad /= self.world_size  # BUG: a bias is summed, not averaged


class CudaTimedUnbroadcastSharded(torch.optim.Optimizer):
    """Times its step with torch.cuda.synchronize() (which raises on a machine without CUDA) and
    never broadcasts the parameters the last rank owns: the other ranks keep them unchanged.
    Parameters go round-robin to the ranks; each rank steps a wrapped optimizer over its own."""

    def __init__(self, params, optimizer_cls, **kwargs):
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        groups = list(params)
        if groups and not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        groups = [{**g, "params": list(g["params"])} for g in groups]
        self.owner = {}
        for g in groups:
            for p in g["params"]:
                self.owner.setdefault(p, len(self.owner) % self.world_size)
        local = [
            {**g, "params": [p for p in g["params"] if self.owner[p] == self.rank]} for g in groups
        ]
        local = [g for g in local if g["params"]]
        self.local = optimizer_cls(local, **kwargs) if local else None
        super().__init__(groups, kwargs)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        torch.cuda.synchronize()
        if self.local is not None:
            self.local.step()
        for p, owner in self.owner.items():
            if owner < self.world_size - 1:  # BUG: the last rank's parameters are never sent
                dist.broadcast(p.data, src=owner)
        return loss
