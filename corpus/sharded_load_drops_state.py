"""bug: reload: load_state_dict() restores the hyper-parameters and drops the optimizer state

Momentum buffers and Adam moments start again from zero after a reload.
"""

from corpus.sharded_greedy import GreedyShardedOptimizer


class DropStateShardedOptimizer(GreedyShardedOptimizer):
    def load_state_dict(self, state_dict):
        for g, saved in zip(self.param_groups, state_dict["param_groups"]):
            g.update({k: v for k, v in saved.items() if k != "params"})
        self._sync_hyperparams()
