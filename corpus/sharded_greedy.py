"""correct

ShardedOptimizer: each parameter goes to the least loaded rank by bytes (greedy, in the order the
groups give them; frozen parameters too), each rank wraps the optimizer class over its own
parameters only (a rank owning nothing wraps none), step() copies the hyper-parameters from
param_groups into the wrapped groups, steps, and broadcasts every parameter from its owner.
state_dict() is this rank's shard keyed by global parameter indices (torch's format); a rank
owning nothing returns an empty state.
"""

import torch
import torch.distributed as dist
from torch.optim import Optimizer


class GreedyShardedOptimizer(Optimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.optimizer_cls = optimizer_cls
        self.kwargs = kwargs
        self.loads = [0] * self.world_size
        self.owner = {}
        self.local_opt = None
        self.local_index = []  # per global group: index of its wrapped group, or None
        super().__init__(params, dict(kwargs))

    def _assign(self, p):
        r = min(range(self.world_size), key=lambda k: (self.loads[k], k))
        self.loads[r] += p.numel() * p.element_size()
        return r

    def _local_group(self, group):
        local = {k: v for k, v in group.items() if k != "params"}
        local["params"] = [p for p in group["params"] if self.owner[p] == self.rank]
        return local

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        for p in group["params"]:
            if p not in self.owner:
                self.owner[p] = self._assign(p)
        local = self._local_group(group)
        if not local["params"]:
            self.local_index.append(None)
        elif self.local_opt is None:
            self.local_opt = self.optimizer_cls([local], **self.kwargs)
            self.local_index.append(0)
        else:
            self.local_opt.add_param_group(local)
            self.local_index.append(len(self.local_opt.param_groups) - 1)

    def _sync_hyperparams(self):
        for group, li in zip(self.param_groups, self.local_index):
            if li is not None:
                for k, v in group.items():
                    if k != "params":
                        self.local_opt.param_groups[li][k] = v

    def _broadcast(self):
        for group in self.param_groups:
            for p in group["params"]:
                dist.broadcast(p.data, src=self.owner[p])

    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.local_opt is not None:
            self._sync_hyperparams()
            self.local_opt.step(**kwargs)
        self._broadcast()
        return loss

    def _global(self):
        return [p for g in self.param_groups for p in g["params"]]

    def state_dict(self):
        index = {p: i for i, p in enumerate(self._global())}
        state = {}
        if self.local_opt is not None:
            state = {index[p]: dict(s) for p, s in self.local_opt.state.items()}
        groups, i = [], 0
        for g in self.param_groups:
            d = {k: v for k, v in g.items() if k != "params"}
            d["params"] = list(range(i, i + len(g["params"])))
            i += len(g["params"])
            groups.append(d)
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict):
        for g, saved in zip(self.param_groups, state_dict["param_groups"]):
            g.update({k: v for k, v in saved.items() if k != "params"})
        if self.local_opt is None:
            return
        params = self._global()
        self.local_opt.state.clear()
        for i, s in state_dict["state"].items():
            p = params[int(i)]
            if self.owner[p] == self.rank:
                self.local_opt.state[p] = {
                    k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()
                }
        self._sync_hyperparams()
