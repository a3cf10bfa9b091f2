"""bug: core: the wrapped groups keep only the lr, losing each group's momentum, weight decay and betas

Each rank's wrapped group is built as {"params": ..., "lr": group["lr"]}, so every other
hyper-parameter falls back to the optimizer's constructor defaults.
"""

from corpus.sharded_greedy import GreedyShardedOptimizer


class LrOnlyShardedOptimizer(GreedyShardedOptimizer):
    def _local_group(self, group):
        return {
            "params": [p for p in group["params"] if self.owner[p] == self.rank],
            "lr": group["lr"],
        }

    def _sync_hyperparams(self):
        for group, li in zip(self.param_groups, self.local_index):
            if li is not None:
                self.local_opt.param_groups[li]["lr"] = group["lr"]
