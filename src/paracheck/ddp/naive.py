"""NaiveDDP: one blocking all-reduce per parameter after backward. The baseline of the family."""

from __future__ import annotations

import torch.distributed as dist

from paracheck.ddp._common import DDPBase

__all__ = ["NaiveDDP"]


class NaiveDDP(DDPBase):
    """Equal to single-process training with per-rank mean losses averaged over ranks (the oracle),
    given identical parameter registration order on every rank; in float64 on gloo it matches the
    oracle to reduction-order rounding and ranks agree bit-for-bit.

    Collectives every rank must call: the constructor (broadcast from rank 0) and
    ``finish_gradient_synchronization()`` (one presence all-reduce, then one all-reduce per
    parameter that some rank has a gradient for). ``requires_grad=False`` parameters are ignored.
    """

    def finish_gradient_synchronization(self) -> None:
        if self.world_size == 1 or not self._sync_enabled:
            return
        params = self.trainable
        flags = self._presence(params)
        dist.all_reduce(flags, group=self.process_group)
        for p, flag in zip(params, flags.tolist()):
            if flag == 0:
                continue
            if p.grad is None:
                p.grad = self._local_or_zero(p)
            dist.all_reduce(p.grad, group=self.process_group)
            p.grad.div_(self.world_size)
