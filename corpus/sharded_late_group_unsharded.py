"""bug: core: a group added by add_param_group() after construction is never sharded

Only the constructor's groups are partitioned; a later group is registered in param_groups but
no rank steps it (and its parameters are broadcast from rank 0 unchanged).
"""

import torch.distributed as dist
from torch.optim import Optimizer

from corpus.sharded_greedy import GreedyShardedOptimizer


class LateGroupUnshardedOptimizer(GreedyShardedOptimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        self.constructed = False
        super().__init__(params, optimizer_cls, **kwargs)
        self.constructed = True

    def add_param_group(self, param_group):
        if self.constructed:
            Optimizer.add_param_group(self, param_group)
            self.local_index.append(None)
        else:
            super().add_param_group(param_group)

    def _broadcast(self):
        for group in self.param_groups:
            for p in group["params"]:
                dist.broadcast(p.data, src=self.owner.get(p, 0))
