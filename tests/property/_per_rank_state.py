"""A sharded optimizer whose ``state_dict()`` is its own shard (the CS336 reading): correct, and
not loadable at another world size (Note [Resuming at another world size])."""

from paracheck.zero import ShardedOptimizer


class PerRankShardedOptimizer(ShardedOptimizer):
    """``ShardedOptimizer`` returning the wrapped optimizer's own state: this rank's shard only."""

    def state_dict(self) -> dict:
        return self.local_optimizer.state_dict()
