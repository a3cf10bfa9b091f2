"""What every DDP variant shares: the protocol, the initial broadcast, and the "who has a
gradient" rule. One place for world_size == 1 (STYLE 5): ``_Group`` reports ``size == 1`` and the
variants skip every collective.

Note [Gradients that exist on some ranks only]
    A parameter can get a gradient on one rank and none on another (a data-dependent branch), or
    none anywhere. Single-process semantics (the oracle): a parameter that no rank used keeps
    ``grad is None`` so the optimizer skips it; one used somewhere gets the average over all ranks,
    the others contributing zeros. Every rank must also issue the *same* collectives in the *same*
    order whatever its local gradients are, or the job hangs. So each variant reduces, alongside
    the gradients, one presence flag per parameter (1.0 where the local gradient exists); after the
    sum, flag 0 means "no rank had one" and the gradient is set back to None.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["DDPBase", "check_bucket_size_mb"]


def check_bucket_size_mb(bucket_size_mb) -> float:
    try:
        value = float(bucket_size_mb)
    except (TypeError, ValueError):
        raise TypeError(f"bucket_size_mb={bucket_size_mb!r} must be a number of megabytes") from None
    if math.isnan(value) or math.isinf(value) or value <= 0:
        raise ValueError(f"bucket_size_mb={bucket_size_mb!r} must be a finite number > 0")
    return value


class DDPBase(nn.Module):
    """Shared protocol: ``forward`` delegates to the module, ``finish_gradient_synchronization()``
    (a collective: every rank must call it after backward, before ``optimizer.step()``) leaves
    every trainable parameter's ``.grad`` equal to the average over ranks, and ``no_sync()``
    skips synchronisation for gradient accumulation.

    Construction is a collective too: parameters and buffers are broadcast from the group's first
    rank, so every rank starts from the same model.
    """

    def __init__(self, module: nn.Module, *, process_group=None):
        super().__init__()
        self.module = module
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group) if dist.is_initialized() else 1
        # parameters() de-duplicates tied parameters: a tied weight is reduced once.
        self.trainable = [p for p in module.parameters() if p.requires_grad]
        self._sync_enabled = True
        self._broadcast_state()

    def _broadcast_state(self) -> None:
        if self.world_size == 1:
            return
        src = dist.get_global_rank(self.process_group, 0) if self.process_group is not None else 0
        with torch.no_grad():
            for t in [*self.module.parameters(), *self.module.buffers()]:
                dist.broadcast(t.data, src=src, group=self.process_group)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Within this context backward passes only accumulate local gradients; the next
        synchronised backward (or ``finish_gradient_synchronization()``) reduces the sum."""
        previous = self._sync_enabled
        self._sync_enabled = False
        try:
            yield
        finally:
            self._sync_enabled = previous

    def finish_gradient_synchronization(self) -> None:
        raise NotImplementedError

    # -- helpers for the variants ---------------------------------------------------------
    def _presence(self, params) -> torch.Tensor:
        ref = params[0] if params else torch.empty(0)
        return torch.tensor([0.0 if p.grad is None else 1.0 for p in params], dtype=ref.dtype, device=ref.device)

    def _local_or_zero(self, p) -> torch.Tensor:
        return p.grad if p.grad is not None else torch.zeros_like(p)

    @staticmethod
    def _scatter_back(params, flat: torch.Tensor, flags: torch.Tensor) -> None:
        """Write the reduced ``flat`` (concatenated gradients) into each ``.grad``;
        see Note [Gradients that exist on some ranks only]."""
        offset = 0
        for p, flag in zip(params, flags.tolist()):
            n = p.numel()
            if flag == 0:
                p.grad = None
            elif p.grad is None:
                p.grad = flat[offset : offset + n].view_as(p).clone()
            else:
                p.grad.copy_(flat[offset : offset + n].view_as(p))
            offset += n
