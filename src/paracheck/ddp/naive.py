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
        for p in self._params_to_reduce():
            if p.grad is None:
                p.grad = self._local_or_zero(p)
            dist.all_reduce(p.grad, group=self.process_group)
            p.grad.div_(self.world_size)

    def _params_to_reduce(self) -> list:
        """The trainable parameters some rank has a gradient for: the same list on every rank,
        whatever this rank's own gradients (Note [Gradients that exist on some ranks only])."""
        flags = self._presence(self.trainable)
        dist.all_reduce(flags, group=self.process_group)
        return [p for p, flag in zip(self.trainable, flags.tolist()) if flag != 0]
