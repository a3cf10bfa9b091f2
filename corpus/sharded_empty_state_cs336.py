"""bug: core|reload|reshard: state_dict() has an empty state (every rank keeps its own shard), so a reload loses the optimizer state
    shows: optimizer-state, state-consolidated, reshard
    match: is on no rank|after the load|state_dict

Correct within the CS336 contract, which never saves or reloads the optimizer: the greedy sharded
optimizer whose state_dict() returns the groups' hyper-parameters and no state, and whose
load_state_dict() restores only the hyper-parameters. Any failure outside the reload row is a
false failure.
"""

from corpus.sharded_greedy import GreedyShardedOptimizer


class EmptyStateShardedOptimizer(GreedyShardedOptimizer):
    def state_dict(self):
        saved = super().state_dict()
        saved["state"] = {}
        return saved
