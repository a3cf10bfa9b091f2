"""bug: core: hyper-parameters are copied to the wrapped groups by position, but a rank owning nothing in a group has no wrapped group for it, so later groups get the wrong lr and decay
    shows: parameters, optimizer-state, rank-agreement, state-consolidated
bug: lr-changes|scheduler: param_groups are built with no defaults, so a group passed as a bare parameter list has no 'lr' (KeyError 'lr' where its lr is read or scheduled)
    shows: raised
    match: KeyError|'lr'
bug: core|reload|reshard: no state_dict() of its own: torch's Optimizer.state_dict() of the wrapper holds no state (the wrapped optimizer has it)
    shows: optimizer-state, state-consolidated, reshard
    match: is on no rank|after the load|state_dict

Optimizer.__init__(params, defaults={}) "because the wrapped optimizer has the defaults"; each rank
wraps one group per global group it owns parameters of, and step() copies the hyper-parameters
with zip(self.param_groups, wrapped.param_groups).
"""

import torch
import torch.distributed as dist
from torch.optim import Optimizer


class NoDefaultsShardedOptimizer(Optimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.optimizer_cls, self.kwargs = optimizer_cls, kwargs
        self.load = [0] * self.world_size
        self.owner = {}
        self.wrapped = None
        super().__init__(params, {})

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        mine = []
        for p in group["params"]:
            r = min(range(self.world_size), key=lambda k: (self.load[k], k))
            self.owner[p] = r
            self.load[r] += p.numel()
            if r == self.rank:
                mine.append(p)
        if not mine:
            return
        local = {k: v for k, v in group.items() if k != "params"}
        local["params"] = mine
        if self.wrapped is None:
            self.wrapped = self.optimizer_cls([local], **self.kwargs)
        else:
            self.wrapped.add_param_group(local)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.wrapped is not None:
            for group, local in zip(self.param_groups, self.wrapped.param_groups):
                for k, v in group.items():
                    if k != "params":
                        local[k] = v
            self.wrapped.step()
        for group in self.param_groups:
            for p in group["params"]:
                dist.broadcast(p.data, self.owner[p])
        return loss
