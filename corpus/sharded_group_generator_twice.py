"""bug: groups-generators: a group's params are read before torch.optim.Optimizer reads them

add_param_group() assigns owners by iterating param_group["params"] and then hands the same dict
to torch.optim.Optimizer.add_param_group(): a generator there is already exhausted, so the group
is registered with no parameters and its parameters are never stepped.
"""

import torch

from corpus.sharded_greedy import GreedyShardedOptimizer


class GroupGeneratorTwiceShardedOptimizer(GreedyShardedOptimizer):
    def add_param_group(self, param_group):
        params = param_group["params"]
        for p in [params] if isinstance(params, torch.Tensor) else params:
            if p not in self.owner:
                self.owner[p] = self._assign(p)
        super().add_param_group(param_group)
