"""A numerically correct ShardedOptimizer written outside paracheck that deals parameters to ranks
round-robin by count, whatever their size: on an MLP with biases, one rank steps the state of
every weight matrix and the other of every bias. It declares no partition."""

from tests.regression.outside.sharded_empty_shard import EmptyShardOptimizer


class RoundRobinOptimizer(EmptyShardOptimizer):
    def _choose_owner(self, p):
        return len(self._owner) % self._ws
