"""correct

ShardedOptimizer partitioned largest parameter first: each group's parameters are sorted by size
(descending) and dealt to the least loaded rank. After the local step every owner sends its
parameters as one flat tensor per dtype (ranks owning nothing of a dtype send nothing, and every
rank knows it). state_dict() is consolidated: every rank gathers the shards (all_gather_object)
and returns the whole state under global indices; load_state_dict() keeps its own part.
"""

import torch
import torch.distributed as dist


class CoalescedShardedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        self._rank, self._world = dist.get_rank(), dist.get_world_size()
        self._cls, self._kwargs = optimizer_cls, kwargs
        self._bytes = [0] * self._world
        self._owner = {}
        self._inner = None
        self._inner_of = []
        super().__init__(params, kwargs)

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        for p in sorted(group["params"], key=lambda q: -q.numel() * q.element_size()):
            if p not in self._owner:
                r = self._bytes.index(min(self._bytes))
                self._owner[p] = r
                self._bytes[r] += p.numel() * p.element_size()
        mine = [p for p in group["params"] if self._owner[p] == self._rank]
        if not mine:
            self._inner_of.append(None)
            return
        inner_group = {**{k: v for k, v in group.items() if k != "params"}, "params": mine}
        if self._inner is None:
            self._inner = self._cls([inner_group], **self._kwargs)
        else:
            self._inner.add_param_group(inner_group)
        self._inner_of.append(len(self._inner.param_groups) - 1)

    def _owned_by(self, rank, dtype):
        out, seen = [], set()
        for g in self.param_groups:
            for p in g["params"]:
                if self._owner[p] == rank and p.dtype == dtype and p not in seen:
                    seen.add(p)
                    out.append(p)
        return out

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._inner is not None:
            for g, i in zip(self.param_groups, self._inner_of):
                if i is not None:
                    for k, v in g.items():
                        if k != "params":
                            self._inner.param_groups[i][k] = v
            self._inner.step()
        dtypes = sorted({p.dtype for p in self._owner}, key=str)
        for r in range(self._world):
            for dtype in dtypes:
                params = self._owned_by(r, dtype)
                if not params:
                    continue
                flat = torch.cat([p.detach().reshape(-1) for p in params])
                dist.broadcast(flat, src=r)
                if r != self._rank:
                    offset = 0
                    for p in params:
                        p.copy_(flat[offset : offset + p.numel()].view_as(p))
                        offset += p.numel()
        return loss

    def _flat_params(self):
        return [p for g in self.param_groups for p in g["params"]]

    def state_dict(self):
        index = {p: i for i, p in enumerate(self._flat_params())}
        mine = {}
        if self._inner is not None:
            for p, s in self._inner.state.items():
                mine[index[p]] = {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
        shards = [None] * self._world
        dist.all_gather_object(shards, mine)
        state = {}
        for shard in shards:
            state.update(shard)
        groups, start = [], 0
        for g in self.param_groups:
            groups.append(
                {
                    **{k: v for k, v in g.items() if k != "params"},
                    "params": list(range(start, start + len(g["params"]))),
                }
            )
            start += len(g["params"])
        return {"state": dict(sorted(state.items())), "param_groups": groups}

    def load_state_dict(self, state_dict):
        for g, saved in zip(self.param_groups, state_dict["param_groups"]):
            for k, v in saved.items():
                if k != "params":
                    g[k] = v
        if self._inner is None:
            return
        params = self._flat_params()
        self._inner.state.clear()
        for i, s in state_dict["state"].items():
            p = params[int(i)]
            if self._owner[p] == self._rank:
                self._inner.state[p] = {
                    k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()
                }
        for g, i in zip(self.param_groups, self._inner_of):
            if i is not None:
                for k, v in g.items():
                    if k != "params":
                        self._inner.param_groups[i][k] = v
