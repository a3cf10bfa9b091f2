"""bug: core: weight decay is applied twice, once by the wrapper (decoupled, p *= 1 - lr * wd) and once by the wrapped optimizer
    shows: parameters, optimizer-state, rank-agreement, state-consolidated
bug: core: the parameters of the last rank are never broadcast (range(world_size - 1))
    shows: parameters, rank-agreement
cuda: torch.cuda.Event timing of the step and of the broadcasts, synchronised on every step
bug: core|reload|reshard: no state_dict() of its own: torch's Optimizer.state_dict() of the wrapper holds no state (the wrapped optimizer has it)
    shows: optimizer-state, state-consolidated, reshard
    match: is on no rank|after the load|state_dict

Two wrong parameter updates of the same property, and CUDA-event timing of both phases.
"""

import torch
import torch.distributed as dist
from torch.optim import Optimizer


class EventsDecayTwiceOptimizer(Optimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.optimizer_cls, self.kwargs = optimizer_cls, kwargs
        self.load = [0] * self.world_size
        self.owner = {}
        self.local = None
        self.local_index = []
        self.timings = []
        super().__init__(params, dict(kwargs))

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        for p in group["params"]:
            if p not in self.owner:
                r = min(range(self.world_size), key=lambda k: (self.load[k], k))
                self.owner[p] = r
                self.load[r] += p.numel() * p.element_size()
        mine = {k: v for k, v in group.items() if k != "params"}
        mine["params"] = [p for p in group["params"] if self.owner[p] == self.rank]
        if not mine["params"]:
            self.local_index.append(None)
            return
        if self.local is None:
            self.local = self.optimizer_cls([mine], **self.kwargs)
        else:
            self.local.add_param_group(mine)
        self.local_index.append(len(self.local.param_groups) - 1)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        start = torch.cuda.Event(enable_timing=True)
        mid = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        if self.local is not None:
            for group, li in zip(self.param_groups, self.local_index):
                if li is None:
                    continue
                for k, v in group.items():
                    if k != "params":
                        self.local.param_groups[li][k] = v
                for p in self.local.param_groups[li]["params"]:
                    if p.grad is not None and group.get("weight_decay", 0):
                        p.mul_(1 - group["lr"] * group["weight_decay"])
            self.local.step()
        mid.record()
        for src in range(self.world_size - 1):
            for group in self.param_groups:
                for p in group["params"]:
                    if self.owner[p] == src:
                        dist.broadcast(p.data, src=src)
        end.record()
        torch.cuda.synchronize()
        self.timings.append((start.elapsed_time(mid), mid.elapsed_time(end)))
        return loss
