"""bug: core: rank 0 all-reduces a gradient norm for its log that the other ranks never join

A debugging line left in finish_gradient_synchronization(): only rank 0 computes the global
gradient norm, with one more all_reduce, so rank 0's collectives no longer match the others'.
"""

import torch
import torch.distributed as dist

from corpus.ddp_flat import FlatDDP


class Rank0NormDDP(FlatDDP):
    @torch.no_grad()
    def finish_gradient_synchronization(self):
        super().finish_gradient_synchronization()
        if dist.get_rank() == 0:
            norm = torch.zeros((), dtype=torch.float64)
            for p in self.params:
                if p.grad is not None:
                    norm += p.grad.double().pow(2).sum()
            dist.all_reduce(norm)
            self.last_norm = norm.sqrt().item()
