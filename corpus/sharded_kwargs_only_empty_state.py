"""bug: core: each rank's wrapped optimizer is built from the constructor's kwargs over one group, so the groups' own lr, momentum and weight decay are lost
    shows: parameters, optimizer-state, rank-agreement, state-consolidated
bug: core|reload|reshard: state_dict() returns an empty dict and load_state_dict() does nothing ("the shards rebuild themselves")
    shows: optimizer-state, state-consolidated, reshard
    match: is on no rank|after the load|state_dict

A sharded optimizer that owns parameters greedily by size, steps a wrapped optimizer made as
optimizer_cls(my_params, **kwargs), times step() with time.perf_counter() and prints it on
rank 0 every few steps, and has an empty state_dict() "since every rank keeps its own shard".
"""

import time

import torch
import torch.distributed as dist
from torch.optim import Optimizer


class KwargsOnlyShardedOptimizer(Optimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.optimizer_cls = optimizer_cls
        self.kwargs = kwargs
        self.sizes = [0] * self.world_size
        self.owner = {}
        self.my_params = []
        self.inner = None
        self.step_times = []
        super().__init__(params, kwargs)

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        new = []
        for p in self.param_groups[-1]["params"]:
            if p in self.owner:
                continue
            r = self.sizes.index(min(self.sizes))
            self.owner[p] = r
            self.sizes[r] += p.numel()
            if r == self.rank:
                new.append(p)
        self.my_params += new
        if new:
            if self.inner is None:
                self.inner = self.optimizer_cls(new, **self.kwargs)
            else:
                self.inner.add_param_group({"params": new})

    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        t0 = time.perf_counter()
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.inner is not None:
            self.inner.step(**kwargs)
        for group in self.param_groups:
            for p in group["params"]:
                dist.broadcast(p.data, src=self.owner[p])
        self.step_times.append(time.perf_counter() - t0)
        if self.rank == 0 and len(self.step_times) % 50 == 0:
            print(f"step {len(self.step_times)}: {1e3 * self.step_times[-1]:.1f} ms")
        return loss

    def state_dict(self):
        return {}

    def load_state_dict(self, state_dict):
        pass
