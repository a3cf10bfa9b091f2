"""bug: clip: clip_grad_norm_() clips by the norm of this rank's own parameters' gradients

Each rank scales its shard by its own shard's norm instead of the norm of every gradient, so the
ranks clip by different factors and none by the global one.
"""

import torch

from corpus.sharded_greedy import GreedyShardedOptimizer


class LocalClipShardedOptimizer(GreedyShardedOptimizer):
    @torch.no_grad()
    def clip_grad_norm_(self, max_norm):
        mine = [
            p
            for g in self.param_groups
            for p in g["params"]
            if self.owner[p] == self.rank and p.grad is not None
        ]
        if not mine:
            return torch.zeros(())
        total = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in mine]))
        scale = max_norm / (total + 1e-6)
        if scale < 1:
            for p in mine:
                p.grad.mul_(scale)
        return total
