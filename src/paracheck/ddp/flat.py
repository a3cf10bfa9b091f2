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
        flat = self._flatten(params)
        dist.all_reduce(flat, group=self.process_group)
        n = flat.numel() - len(params)
        self._scatter_back(params, self._average(flat[:n]), flat[n:])

    def _flatten(self, params) -> torch.Tensor:
        """One buffer: every local gradient (zeros where there is none), then the presence flags.
        ``torch.cat`` promotes to the widest dtype, so a float32 layer in a float64 model loses
        nothing."""
        return torch.cat(
            [self._local_or_zero(p).reshape(-1) for p in params] + [self._presence(params)]
        )

    def _average(self, summed: torch.Tensor) -> torch.Tensor:
        return summed.div_(self.world_size)
