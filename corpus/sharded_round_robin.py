"""bug: core: parameters dealt round-robin by count, so one rank can hold almost all the state

The greedy sharded optimizer with parameter i going to rank i % world_size whatever its size:
numerically right, but with one large and several small parameters one rank steps (and keeps the
optimizer state of) nearly every byte.
"""

from corpus.sharded_greedy import GreedyShardedOptimizer


class RoundRobinShardedOptimizer(GreedyShardedOptimizer):
    def _assign(self, p):
        return len(self.owner) % self.world_size
