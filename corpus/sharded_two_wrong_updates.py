"""bug: core: momentum is dropped from the wrapped optimizer's kwargs ("the wrapper handles it") and never applied
    shows: parameters, optimizer-state, rank-agreement, state-consolidated
bug: core: the owner divides each (already averaged) gradient by the world size again before its step, "as if the other ranks had contributed zeros"
    shows: gradients, parameters, optimizer-state, rank-agreement, state-consolidated
bug: core|reload|reshard: no state_dict() of its own: torch's Optimizer.state_dict() of the wrapper holds no state (the wrapped optimizer has it)
    shows: optimizer-state, state-consolidated, reshard
    match: is on no rank|after the load|state_dict

Two wrong updates of the same property: a round-by-size sharded optimizer whose constructor pops
momentum out of the kwargs and out of every group, and whose step() "averages" each gradient by
dividing it by the world size, as if the other ranks had contributed zeros.
"""

import torch
import torch.distributed as dist
from torch.optim import Optimizer


class TwoWrongUpdatesOptimizer(Optimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        kwargs = dict(kwargs)
        kwargs.pop("momentum", None)
        self.optimizer_cls, self.kwargs = optimizer_cls, kwargs
        self.load = [0] * self.world_size
        self.owner = {}
        self.local = None
        self.local_index = []
        super().__init__(params, dict(kwargs))

    def add_param_group(self, param_group):
        param_group = {k: v for k, v in param_group.items() if k != "momentum"}
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
        elif self.local is None:
            self.local = self.optimizer_cls([mine], **self.kwargs)
            self.local_index.append(0)
        else:
            self.local.add_param_group(mine)
            self.local_index.append(len(self.local.param_groups) - 1)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.local is not None:
            for group, li in zip(self.param_groups, self.local_index):
                if li is None:
                    continue
                local = self.local.param_groups[li]
                for k, v in group.items():
                    if k != "params":
                        local[k] = v
                for p in local["params"]:
                    if p.grad is not None:
                        p.grad /= self.world_size
            self.local.step()
        for group in self.param_groups:
            for p in group["params"]:
                dist.broadcast(p.data, src=self.owner[p])
        return loss
