"""bug: lr-changes: the wrapped optimizer keeps the hyper-parameters it was built with

The wrapped groups are copies made at add_param_group(); step() never copies param_groups into
them again, so an lr set through param_groups (by hand or by a scheduler) is lost.
"""

from corpus.sharded_greedy import GreedyShardedOptimizer


class FrozenLrShardedOptimizer(GreedyShardedOptimizer):
    def _sync_hyperparams(self):
        pass
