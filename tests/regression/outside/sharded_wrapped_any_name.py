"""A correct ShardedOptimizer written outside paracheck: greedy partition in registration order,
asynchronous broadcasts launched then waited, and state_dict() = the wrapped optimizer's own
(per-rank shard, wrapped indices), the wrapped optimizer kept in ``self._wrapped``."""

import torch
import torch.distributed as dist


class AsyncShardedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        self._rank = dist.get_rank() if dist.is_initialized() else 0
        self._ws = dist.get_world_size() if dist.is_initialized() else 1
        self._cls = optimizer_cls
        self._kw = kwargs
        self._sizes = [0] * self._ws
        self._owner = {}
        self._wrapped = None
        super().__init__(params, kwargs)

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        for p in group["params"]:
            if p.requires_grad and id(p) not in self._owner:
                r = min(range(self._ws), key=lambda k: (self._sizes[k], k))
                self._owner[id(p)] = r
                self._sizes[r] += p.numel()
        sub = {k: v for k, v in group.items() if k != "params"}
        sub["params"] = [p for p in group["params"] if self._owner.get(id(p)) == self._rank]
        if self._wrapped is None:
            self._wrapped = self._cls([sub], **self._kw)
        else:
            self._wrapped.add_param_group(sub)

    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        for g, wg in zip(self.param_groups, self._wrapped.param_groups):
            for k, v in g.items():
                if k != "params":
                    wg[k] = v
        loss = self._wrapped.step(closure, **kwargs)
        if self._ws > 1:
            handles, seen = [], set()
            for g in self.param_groups:
                for p in g["params"]:
                    if id(p) in self._owner and id(p) not in seen:
                        seen.add(id(p))
                        handles.append(
                            dist.broadcast(p.data, src=self._owner[id(p)], async_op=True)
                        )
            for h in handles:
                h.wait()
        return loss

    def state_dict(self):
        for g, wg in zip(
            self.param_groups, self._wrapped.param_groups
        ):  # lr set since the last step
            for k, v in g.items():
                if k != "params":
                    wg[k] = v
        return self._wrapped.state_dict()

    def load_state_dict(self, state_dict):
        self._wrapped.load_state_dict(state_dict)
        for g, wg in zip(self.param_groups, self._wrapped.param_groups):
            for k, v in wg.items():
                if k != "params":
                    g[k] = v
