"""correct

A sharded optimizer that is not a torch.optim.Optimizer: it keeps its own param_groups (dicts with
the constructor's keyword arguments as defaults), gives each parameter to the least loaded rank by
bytes, steps one wrapped optimizer per rank over that rank's parameters, and sends the
updated parameters with async broadcasts, all launched, then all waited on. state_dict() is the
wrapped optimizer's own (this rank's shard in its own indices); an empty dict on a rank that owns
nothing.
"""

import torch
import torch.distributed as dist


class PlainShardedOptimizer:
    def __init__(self, params, optimizer_cls, **kwargs):
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.optimizer_cls, self.defaults = optimizer_cls, dict(kwargs)
        self.param_groups, self.owner = [], {}
        self.counts = [0] * self.world_size
        self.wrapped, self.wrapped_of = None, []
        params = list(params)
        if params and not isinstance(params[0], dict):
            params = [{"params": params}]
        for group in params:
            self.add_param_group(group)

    def add_param_group(self, param_group):
        group = {**self.defaults, **param_group}
        ps = group["params"]
        group["params"] = [ps] if isinstance(ps, torch.Tensor) else list(ps)
        self.param_groups.append(group)
        for p in group["params"]:
            if p not in self.owner:
                r = min(range(self.world_size), key=lambda k: (self.counts[k], k))
                self.owner[p] = r
                self.counts[r] += p.numel() * p.element_size()
        mine = {k: v for k, v in group.items() if k != "params"}
        mine["params"] = [p for p in group["params"] if self.owner[p] == self.rank]
        if not mine["params"]:
            self.wrapped_of.append(None)
            return
        if self.wrapped is None:
            self.wrapped = self.optimizer_cls([mine], **self.defaults)
        else:
            self.wrapped.add_param_group(mine)
        self.wrapped_of.append(len(self.wrapped.param_groups) - 1)

    def zero_grad(self, set_to_none=True):
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    if set_to_none:
                        p.grad = None
                    else:
                        p.grad.detach_()
                        p.grad.zero_()

    def _copy_hyperparameters(self):
        for g, i in zip(self.param_groups, self.wrapped_of):
            if i is not None:
                self.wrapped.param_groups[i].update({k: v for k, v in g.items() if k != "params"})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.wrapped is not None:
            self._copy_hyperparameters()
            self.wrapped.step()
        handles = []
        for g in self.param_groups:
            for p in g["params"]:
                handles.append(dist.broadcast(p.data, src=self.owner[p], async_op=True))
        for h in handles:
            h.wait()
        return loss

    def state_dict(self):
        if self.wrapped is None:
            return {}
        self._copy_hyperparameters()
        return self.wrapped.state_dict()

    def load_state_dict(self, state_dict):
        if self.wrapped is None or not state_dict:
            return
        self.wrapped.load_state_dict(state_dict)
        for g, i in zip(self.param_groups, self.wrapped_of):
            if i is not None:
                g.update({k: v for k, v in self.wrapped.param_groups[i].items() if k != "params"})
