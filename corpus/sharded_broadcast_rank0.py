"""bug: core: the updated parameters are broadcast from rank 0 instead of from their owner

Every rank ends the step with rank 0's copy, which rank 0 stepped only for the parameters it owns.
"""

import torch.distributed as dist

from corpus.sharded_greedy import GreedyShardedOptimizer


class BroadcastRank0ShardedOptimizer(GreedyShardedOptimizer):
    def _broadcast(self):
        for group in self.param_groups:
            for p in group["params"]:
                dist.broadcast(p.data, src=0)
