"""bug: core: a group added by add_param_group() after construction gets owners and broadcasts, but its parameters are never handed to the owner's wrapped optimizer, so they are never stepped
    shows: parameters, optimizer-state, rank-agreement, structure, state-consolidated

Its state_dict() is this rank's wrapped optimizer's own (local indices, local groups): a per-rank
reading paracheck accepts (a shard of each rank's own parameters; only the opt-in
state-consolidated property asks for more), so it is no planted bug.

The wrapped optimizer is built once, in the constructor, over the parameters this rank owns;
add_param_group() is Optimizer's own plus the owner bookkeeping. state_dict() and
load_state_dict() pass through to the wrapped optimizer.
"""

import torch
import torch.distributed as dist
from torch.optim import Optimizer


class LocalStateLateGroupOptimizer(Optimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.bytes = [0] * self.world
        self.owner = {}
        super().__init__(params, kwargs)
        local = []
        for g in self.param_groups:
            mine = [p for p in g["params"] if self.owner[p] == self.rank]
            if mine:
                local.append({**{k: v for k, v in g.items() if k != "params"}, "params": mine})
        self.local_groups = [
            i
            for i, g in enumerate(self.param_groups)
            if any(self.owner[p] == self.rank for p in g["params"])
        ]
        self.inner = optimizer_cls(local, **kwargs) if local else None

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        for p in self.param_groups[-1]["params"]:
            if p not in self.owner:
                r = min(range(self.world), key=lambda k: (self.bytes[k], k))
                self.owner[p] = r
                self.bytes[r] += p.numel() * p.element_size()

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.inner is not None:
            for i, li in zip(self.local_groups, range(len(self.inner.param_groups))):
                for k, v in self.param_groups[i].items():
                    if k != "params":
                        self.inner.param_groups[li][k] = v
            self.inner.step()
        for g in self.param_groups:
            for p in g["params"]:
                dist.broadcast(p.data, src=self.owner[p])
        return loss

    def state_dict(self):
        return (
            self.inner.state_dict() if self.inner is not None else {"state": {}, "param_groups": []}
        )

    def load_state_dict(self, state_dict):
        if self.inner is not None:
            self.inner.load_state_dict(state_dict)
