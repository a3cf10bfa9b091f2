"""bug: core: zero_grad() clears only the gradients of this rank's own parameters

zero_grad() is forwarded to the wrapped optimizer, which holds only the local shard; the other
parameters keep last step's gradient and the next backward adds to it.
"""

from corpus.sharded_greedy import GreedyShardedOptimizer


class LocalZeroGradShardedOptimizer(GreedyShardedOptimizer):
    def zero_grad(self, set_to_none: bool = True):
        if self.local_opt is not None:
            self.local_opt.zero_grad(set_to_none=set_to_none)
