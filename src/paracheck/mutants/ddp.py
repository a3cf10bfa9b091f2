"""Broken DDP variants. Each differs from a correct one by one realistic bug."""

from __future__ import annotations

import torch
import torch.distributed as dist

from paracheck.ddp.flat import FlatDDP

__all__ = ["NoDivideDDP"]


class NoDivideDDP(FlatDDP):
    """FlatDDP that forgets to divide the summed gradients by the world size."""

    def finish_gradient_synchronization(self) -> None:
        if self.world_size == 1 or not self._sync_enabled or not self.trainable:
            return
        params = self.trainable
        flags = self._presence(params)
        flat = torch.cat([self._local_or_zero(p).reshape(-1) for p in params] + [flags])
        dist.all_reduce(flat, group=self.process_group)
        n = flat.numel() - len(params)
        self._scatter_back(params, flat[:n], flat[n:])  # BUG: no .div_(world_size)
