"""bug: core: step(closure) calls the closure on rank 0 only ("the loss is only logged there"), so the other ranks never join its forward, backward and gradient synchronisation
    shows: hang, died, raised
bug: clip: clip_grad_norm_() all-reduces the squared shard norms and takes the result as the norm, without the square root
    shows: parameters, gradients, optimizer-state, state-consolidated, rank-agreement

The greedy-by-bytes sharded optimizer (corpus/sharded_greedy.py) with a step() that evaluates the
closure for its loss on rank 0 and a clip_grad_norm_(max_norm) for the global norm over the
shards.
"""

import torch
import torch.distributed as dist

from corpus.sharded_greedy import GreedyShardedOptimizer


class ClosureRank0ShardedOptimizer(GreedyShardedOptimizer):
    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        loss = None
        if closure is not None and self.rank == 0:
            with torch.enable_grad():
                loss = closure()
            print(f"loss {float(loss):.4f}")
        super().step(None, **kwargs)
        return loss

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm):
        mine = [p for p in self.owner if self.owner[p] == self.rank and p.grad is not None]
        sq = torch.zeros((), dtype=torch.float64)
        for p in mine:
            sq += p.grad.double().pow(2).sum()
        dist.all_reduce(sq)
        total = sq.item()
        scale = max_norm / (total + 1e-6)
        if scale < 1:
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.mul_(scale)
        return torch.tensor(total)
