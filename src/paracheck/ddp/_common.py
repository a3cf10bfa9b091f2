"""What every DDP variant shares: the protocol, the initial broadcast, and the "who has a
gradient" rule. One place for world_size == 1: ``_Group`` reports ``size == 1`` and the
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
import functools
import math
import weakref

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["DDPBase", "check_bucket_size_mb", "presence_flags", "reducible_grad"]


def check_bucket_size_mb(bucket_size_mb) -> float:
    try:
        value = float(bucket_size_mb)
    except (TypeError, ValueError):
        raise TypeError(
            f"bucket_size_mb={bucket_size_mb!r} must be a number of megabytes"
        ) from None
    if math.isnan(value) or math.isinf(value) or value <= 0:
        raise ValueError(f"bucket_size_mb={bucket_size_mb!r} must be a finite number > 0")
    return value


def presence_flags(n: int, absent, *, dtype, device) -> torch.Tensor:
    """One presence flag per unit, 0 at the ``absent`` positions and 1 elsewhere, made on the
    device: ones, then a zero per absent unit (rare), never copied from the host (a copy from
    pageable memory is a device sync)."""
    flags = torch.ones(n, dtype=dtype, device=device)
    for i in absent:
        flags[i] = 0
    return flags


def reducible_grad(p: torch.Tensor) -> bool:
    """Make ``p.grad`` a tensor one collective can reduce in place: dense and contiguous (a sparse
    gradient, or one that follows a non-contiguous parameter's strides, becomes a copy), or zeros
    where there is none (this rank contributes nothing; see the presence flags). Return whether
    a local gradient existed."""
    g = p.grad
    if g is None:
        p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
        return False
    if g.layout != torch.strided or not g.is_contiguous():
        p.grad = g.to_dense().contiguous()
    return True


def _end_of_backward(ref: weakref.ref) -> None:
    # A weak reference: the autograd engine holds the callback until backward ends.
    ddp = ref()
    if ddp is not None:
        ddp._end_round()


class RoundsMixin:
    """The round protocol of Note [Several backward passes in one window] (in
    ``paracheck.ddp.overlapped``), for the variants that launch from backward's hooks. A variant
    calls ``_open_round()`` from each hook of a synchronised backward and provides
    ``_launch_rest()`` (launch every unit the round has not launched, in plan order, presence flags
    last) and ``_settle()`` (wait, average, apply the flags, start a new window)."""

    _round_open = False  # a synchronised backward has fired hooks and not ended yet
    # no_sync() entries when the last round was settled; None: no round since the last finish
    _reduced_through: int | None = None

    def _open_round(self) -> None:
        """The round's first hook queues its end on the autograd engine."""
        if not self._round_open:
            self._round_open = True
            torch.autograd.Variable._execution_engine.queue_callback(
                functools.partial(_end_of_backward, weakref.ref(self))
            )

    def _close_round(self) -> None:
        self._round_open = False

    def _end_round(self) -> None:
        """End of a synchronised backward: launch what is left, then settle the round."""
        self._close_round()
        self._launch_rest()
        self._settle()
        self._reduced_through = self._no_sync_entries

    def _finish_window(self) -> None:
        """``finish_gradient_synchronization()``: a round of its own only where backward passes
        since the last round only accumulated, or no synchronised backward ran."""
        if self._reduced_through != self._no_sync_entries:
            self._launch_rest()
            self._settle()
        self._reduced_through = None


class DDPBase(nn.Module):
    """Shared protocol: ``forward`` delegates to the module, ``finish_gradient_synchronization()``
    (a collective: every rank must call it after backward, before ``optimizer.step()``) leaves
    every trainable parameter's ``.grad`` equal to the average over ranks of what the backward
    passes since the last synchronisation accumulated (one or several, of one forward or of
    several), and ``no_sync()`` skips synchronisation for gradient accumulation.

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
        self._no_sync_entries = 0  # how often no_sync() was entered (RoundsMixin reads it)
        self._broadcast_state()

    def _broadcast_state(self) -> None:
        if self.world_size == 1:
            return
        src = dist.get_global_rank(self.process_group, 0) if self.process_group is not None else 0
        with torch.no_grad():
            for t in self._state_tensors():
                dist.broadcast(t.data, src=src, group=self.process_group)

    def _state_tensors(self) -> list[torch.Tensor]:
        """What ranks must agree on before training: every parameter and every buffer."""
        return [*self.module.parameters(), *self.module.buffers()]

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Within this context backward passes only accumulate local gradients; the next
        synchronised backward (or ``finish_gradient_synchronization()``) reduces the sum."""
        previous = self._sync_enabled
        self._sync_enabled = False
        self._no_sync_entries += 1
        try:
            yield
        finally:
            self._sync_enabled = previous

    def finish_gradient_synchronization(self) -> None:
        raise NotImplementedError

    # -- helpers for the variants ---------------------------------------------------------
    def _presence(self, params) -> torch.Tensor:
        ref = params[0] if params else torch.empty(0)
        return torch.tensor(
            [0.0 if p.grad is None else 1.0 for p in params], dtype=ref.dtype, device=ref.device
        )

    def _local_or_zero(self, p) -> torch.Tensor:
        return p.grad if p.grad is not None else torch.zeros_like(p)

    @staticmethod
    def _scatter_back(params, flat: torch.Tensor, flags: torch.Tensor) -> None:
        """Write the reduced ``flat`` (concatenated gradients) into each ``.grad``, in the
        parameter's dtype; see Note [Gradients that exist on some ranks only]."""
        offset = 0
        for p, flag in zip(params, flags.tolist()):
            n = p.numel()
            if flag == 0:
                p.grad = None
            elif p.grad is None:
                p.grad = flat[offset : offset + n].view_as(p).to(p.dtype, copy=True)
            else:
                p.grad.copy_(flat[offset : offset + n].view_as(p))
            offset += n
