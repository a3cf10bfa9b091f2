"""A target for the blame tests, written as the corpus's classes are: a sharded optimizer whose
param_groups drop 'lr'."""

import torch
import torch.distributed as dist


class ParamsOnlyGroupsShardedOptimizer(torch.optim.Optimizer):
    """bug: its param_groups keep each group's parameters only; the hyper-parameters (lr among
    them) live in the wrapped optimizer, so an LR scheduler built on it finds no 'lr'.

    Parameters go round-robin to the ranks; each rank steps a wrapped optimizer over its own and
    broadcasts every parameter from its owner."""

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
        super().__init__([{"params": g["params"]} for g in groups], {})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.local is not None:
            self.local.step()
        for p in self.owner:
            dist.broadcast(p.data, src=self.owner[p])
        return loss
