"""ShardedOptimizer: parameters assigned greedily by size to the least loaded
rank; each rank builds the wrapped optimizer only over its own parameters
(state lives only there); step() steps the local optimizer then broadcasts
every parameter from its owner.  state_dict() is this rank's shard, keyed by
global parameter indices (torch's own format)."""

import torch
import torch.distributed as dist
from torch.optim import Optimizer


class ShardedOptimizer(Optimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self.optimizer_cls = optimizer_cls
        self.opt_kwargs = kwargs
        self.load = [0] * self.world
        self.owner = {}  # param -> rank
        self.local_opt = None
        self.local_group_of = []  # global group index -> local group index or None
        super().__init__(params, defaults=dict(kwargs))

    # ------------------------------------------------------------------
    def add_param_group(self, param_group):
        super().add_param_group(param_group)  # validates, fills defaults
        group = self.param_groups[-1]
        for p in group["params"]:
            if p in self.owner:
                continue
            r = min(range(self.world), key=lambda k: (self.load[k], k))
            self.owner[p] = r
            self.load[r] += p.numel() * p.element_size()
        local = [p for p in group["params"] if self.owner[p] == self.rank]
        if not local:
            self.local_group_of.append(None)
            return
        local_group = {k: v for k, v in group.items() if k != "params"}
        local_group["params"] = local
        if self.local_opt is None:
            self.local_opt = self.optimizer_cls([local_group], **self.opt_kwargs)
        else:
            self.local_opt.add_param_group(local_group)
        self.local_group_of.append(len(self.local_opt.param_groups) - 1)

    def _sync_hyperparams(self):
        for gi, group in enumerate(self.param_groups):
            li = self.local_group_of[gi]
            if li is None:
                continue
            lg = self.local_opt.param_groups[li]
            for k, v in group.items():
                if k != "params":
                    lg[k] = v

    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.local_opt is not None:
            self._sync_hyperparams()
            self.local_opt.step(**kwargs)
        if self.world > 1:
            works = []
            for group in self.param_groups:
                for p in group["params"]:
                    works.append(dist.broadcast(p.data, src=self.owner[p], async_op=True))
            for w in works:
                w.wait()
        return loss

    # ------------------------------------------------------------------
    def _global_params(self):
        return [p for g in self.param_groups for p in g["params"]]

    def state_dict(self):
        params = self._global_params()
        index = {p: i for i, p in enumerate(params)}
        state = {}
        if self.local_opt is not None:
            for p, st in self.local_opt.state.items():
                state[index[p]] = st
        groups = []
        i = 0
        for g in self.param_groups:
            d = {k: v for k, v in g.items() if k != "params"}
            d["params"] = list(range(i, i + len(g["params"])))
            i += len(g["params"])
            groups.append(d)
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict):
        params = self._global_params()
        for g, sg in zip(self.param_groups, state_dict["param_groups"]):
            for k, v in sg.items():
                if k != "params":
                    g[k] = v
        if self.local_opt is None:
            return
        self._sync_hyperparams()
        local_sd = self.local_opt.state_dict()
        # local index order = order of params in local groups
        local_params = [p for g in self.local_opt.param_groups for p in g["params"]]
        local_index = {p: i for i, p in enumerate(local_params)}
        new_state = {}
        for gidx, st in state_dict["state"].items():
            p = params[int(gidx)]
            if p in local_index:
                new_state[local_index[p]] = st
        local_sd["state"] = new_state
        self.local_opt.load_state_dict(local_sd)
