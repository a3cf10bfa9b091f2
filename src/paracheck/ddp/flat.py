"""FlatDDP: every gradient (and one presence flag per parameter) flattened into one buffer and
reduced by a single all-reduce after backward. Diff with NaiveDDP: one collective instead of
one per parameter, at the price of a copy in and out."""

from __future__ import annotations

import torch
import torch.distributed as dist

from paracheck.ddp._common import DDPBase

__all__ = ["FlatDDP"]


class FlatDDP(DDPBase):
    """Equal to the oracle (see NaiveDDP) with exactly one all-reduce per synchronisation.

    Collectives every rank must call: the constructor and ``finish_gradient_synchronization()``.
    """

    def finish_gradient_synchronization(self) -> None:
        if self.world_size == 1 or not self._sync_enabled or not self.trainable:
            return
        params = self.trainable
        flags = self._presence(params)
        flat = torch.cat([self._local_or_zero(p).reshape(-1) for p in params] + [flags])
        dist.all_reduce(flat, group=self.process_group)
        n = flat.numel() - len(params)
        grads = flat[:n].div_(self.world_size)
        self._scatter_back(params, grads, flat[n:])
