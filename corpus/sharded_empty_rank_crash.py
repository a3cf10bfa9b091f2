"""bug: core: step() calls the wrapped optimizer on a rank that owns no parameter (it has none)

With more ranks than parameters, a rank owning nothing never built its wrapped optimizer, and its
step() raises AttributeError on None.
"""

import torch

from corpus.sharded_greedy import GreedyShardedOptimizer


class EmptyRankCrashShardedOptimizer(GreedyShardedOptimizer):
    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._sync_hyperparams()
        self.local_opt.step(**kwargs)
        self._broadcast()
        return loss

    def _sync_hyperparams(self):
        for group, li in zip(self.param_groups, self.local_index):
            if li is not None:
                self.local_opt.param_groups[li].update(
                    {k: v for k, v in group.items() if k != "params"}
                )
