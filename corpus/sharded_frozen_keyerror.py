"""bug: core: only trainable parameters get an owner, but every parameter is broadcast from its owner

A frozen (requires_grad=False) parameter in the groups has no owner, and the broadcast loop raises
KeyError on it.
"""

from torch.optim import Optimizer

from corpus.sharded_greedy import GreedyShardedOptimizer


class FrozenKeyErrorShardedOptimizer(GreedyShardedOptimizer):
    def add_param_group(self, param_group):
        Optimizer.add_param_group(self, param_group)
        group = self.param_groups[-1]
        for p in group["params"]:
            if p.requires_grad and p not in self.owner:
                self.owner[p] = self._assign(p)
        local = {k: v for k, v in group.items() if k != "params"}
        local["params"] = [p for p in group["params"] if self.owner.get(p) == self.rank]
        if not local["params"]:
            self.local_index.append(None)
        elif self.local_opt is None:
            self.local_opt = self.optimizer_cls([local], **self.kwargs)
            self.local_index.append(0)
        else:
            self.local_opt.add_param_group(local)
            self.local_index.append(len(self.local_opt.param_groups) - 1)
