"""A DDP that declares and keeps a float32 reduction (Note [Declared reduction dtype]): the
control the ``ddp-cast-after-communicating`` mutant is compared with."""

import torch
import torch.distributed as dist

from paracheck.ddp import FlatDDP


class Float32ReduceDDP(FlatDDP):
    """FlatDDP that casts every gradient to float32 before the all-reduce, averages in float32
    and writes each mean back in its parameter's dtype (``_scatter_back``)."""

    paracheck_reduce_dtype = torch.float32  # a torch.dtype reads as its name

    def finish_gradient_synchronization(self) -> None:
        if self.world_size == 1 or not self._sync_enabled or not self.trainable:
            return
        params = self.trainable
        flat = self._flatten(params).float()
        dist.all_reduce(flat, group=self.process_group)
        n = flat.numel() - len(params)
        self._scatter_back(params, self._average(flat[:n]), flat[n:])
