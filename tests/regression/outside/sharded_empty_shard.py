"""A correct ShardedOptimizer written outside paracheck: greedy partition by size, one wrapped
optimizer per rank over the parameters it owns, and none on a rank that owns nothing, whose
``state_dict()`` is then an empty shard, ``{"state": {}, "param_groups": []}``, which its own
``load_state_dict()`` accepts."""

import torch
import torch.distributed as dist


class EmptyShardOptimizer(torch.optim.Optimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        self._rank = dist.get_rank() if dist.is_initialized() else 0
        self._ws = dist.get_world_size() if dist.is_initialized() else 1
        self._cls, self._kw = optimizer_cls, kwargs
        self._loads = [0] * self._ws
        self._owner = {}
        self._local = None  # no optimizer on a rank that owns no parameter
        super().__init__(params, kwargs)

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        for p in group["params"]:
            if id(p) not in self._owner:
                r = self._choose_owner(p)
                self._owner[id(p)] = r
                self._loads[r] += p.numel()
        mine = [p for p in group["params"] if self._owner[id(p)] == self._rank]
        if not mine:
            return
        sub = {k: v for k, v in group.items() if k != "params"}
        sub["params"] = mine
        if self._local is None:
            self._local = self._cls([sub], **self._kw)
        else:
            self._local.add_param_group(sub)

    def _choose_owner(self, p):
        return min(range(self._ws), key=lambda k: (self._loads[k], k))  # the least loaded

    def _mine(self):
        """The wrapper's groups holding a parameter of this rank: the local optimizer's groups."""
        return [
            g
            for g in self.param_groups
            if any(self._owner[id(p)] == self._rank for p in g["params"])
        ]

    def _sync_hyperparameters(self):
        for g, lg in zip(self._mine(), self._local.param_groups):
            for k, v in g.items():
                if k != "params":
                    lg[k] = v

    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        loss = None
        if self._local is not None:
            self._sync_hyperparameters()
            loss = self._local.step(closure, **kwargs)
        elif closure is not None:
            with torch.enable_grad():
                loss = closure()
        for g in self.param_groups:
            for p in g["params"]:
                dist.broadcast(p.data, src=self._owner[id(p)])
        return loss

    def zero_grad(self, set_to_none=True):
        super().zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        if self._local is None:
            return {"state": {}, "param_groups": []}
        self._sync_hyperparameters()
        return self._local.state_dict()

    def load_state_dict(self, state_dict):
        if self._local is None:
            if state_dict["state"]:
                raise ValueError("this rank owns no parameter: its state must be empty")
            return
        self._local.load_state_dict(state_dict)
        for g, lg in zip(self._mine(), self._local.param_groups):
            for k, v in lg.items():
                if k != "params":
                    g[k] = v


class LosesStateOptimizer(EmptyShardOptimizer):
    """The design minus its state: every rank's ``state_dict()`` is the empty shard, so the union
    over ranks holds no parameter's state."""

    def state_dict(self):
        return {"state": {}, "param_groups": []}  # BUG: the owners' state is lost
