"""bug: core: a rank owning no parameter returns from step() before the broadcasts (a hang)

"Nothing to do here": the rank that owns nothing skips the whole step, so its peers wait forever
in the broadcasts it never joins.
"""

import torch

from corpus.sharded_greedy import GreedyShardedOptimizer


class EmptyRankReturnsShardedOptimizer(GreedyShardedOptimizer):
    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.local_opt is None:
            return loss
        self._sync_hyperparams()
        self.local_opt.step(**kwargs)
        self._broadcast()
        return loss
