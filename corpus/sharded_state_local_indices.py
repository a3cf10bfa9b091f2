"""bug: reload: state_dict() is the wrapped optimizer's (local indices), load_state_dict() reads global ones

The saved shard numbers this rank's parameters 0, 1, ... in the wrapped optimizer's order, and
the loader maps those numbers onto the global parameter list, so on every rank but the one whose
shard starts the list the state lands on the wrong parameters (or none).
"""

from corpus.sharded_greedy import GreedyShardedOptimizer


class LocalIndicesShardedOptimizer(GreedyShardedOptimizer):
    def state_dict(self):
        saved = super().state_dict()
        if self.local_opt is not None:
            saved["state"] = self.local_opt.state_dict()["state"]
        return saved
