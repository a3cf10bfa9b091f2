"""BucketedDDP: gradients live in flat bucket buffers; one asynchronous all-reduce per bucket,
launched from backward as soon as the bucket is complete. Diff with OverlappedDDP: the unit of the
launch plan is a bucket of parameters (``paracheck.ddp.plan``) instead of one parameter, and each
``.grad`` is a view into its bucket, so backward accumulates straight into the buffer that is
reduced: no copy in, no copy out, no per-parameter collective.

Note [Gradients as bucket views]
    ``p.grad`` is set to a view of its bucket's buffer before backward (in ``forward()``), so
    autograd's AccumulateGrad adds into the buffer in place. ``zero_grad(set_to_none=True)`` drops
    the views; the next ``forward()`` re-attaches them (zeroing the slots), lazily. A gradient that
    is not the view when it matters (backward through ``self.module`` directly, ``zero_grad`` between
    forward and backward, a ``.grad`` assigned by hand) is copied into its slot and the view put
    back: correct, one copy slower. Attaching a zeroed view must not make a parameter look as if
    it had a gradient, so the wrapper keeps a logical "has a local gradient" bit per parameter
    (``_present``), which is what the presence flags carry.

Note [Presence flags in the bucket]
    Each buffer holds the bucket's gradients followed by one flag per parameter (1 where the local
    gradient exists), reduced by the same all-reduce: after it, a flag 0 means no rank had a
    gradient and ``.grad`` goes back to None (Note [Gradients that exist on some ranks only]).
    A rank that had every local gradient of a bucket knows every count is >= 1 and never reads
    the flags back, so the common case never blocks the host on communication.

Communication runs asynchronously (``async_op=True``): on NCCL on the process group's own stream,
with ``wait()`` making the compute stream wait; on gloo on its worker threads. Launch order
follows Note [Launch in plan order] and Note [Hooks under no_sync] in ``paracheck.ddp.overlapped``.
"""

from __future__ import annotations

import functools
import weakref

import torch
import torch.distributed as dist
from torch import nn

from paracheck.ddp._common import DDPBase, check_bucket_size_mb
from paracheck.ddp.plan import plan_buckets

__all__ = ["BucketedDDP"]


def _hook(ref: weakref.ref, i: int, param: torch.Tensor) -> None:
    ddp = ref()  # weak: the hook lives on the parameter, which may outlive this wrapper
    if ddp is not None:
        ddp._grad_ready(i)


class BucketedDDP(DDPBase):
    """Equal to the oracle (see NaiveDDP) for any ``bucket_size_mb``; gradients are views into
    flat bucket buffers and each bucket is reduced by one async all-reduce overlapped with backward.

    ``bucket_size_mb`` (MB = 2**20 bytes of parameters per bucket, a finite number > 0) caps each
    bucket; a parameter larger than the cap gets a bucket of its own. Buckets hold parameters in
    reverse registration order, one dtype and device each; build the wrapper after moving the
    module to its device. Collectives every rank must call: the constructor, every synchronised
    ``backward()`` and ``finish_gradient_synchronization()`` after it, before anything reads
    ``.grad``. With ``world_size == 1`` the collectives are skipped and the same bookkeeping runs.
    """

    planner = staticmethod(plan_buckets)

    def __init__(self, module: nn.Module, bucket_size_mb: float = 25.0, *, process_group=None):
        # Refuse a bad cap before the constructor's collective: every rank raises alike.
        self.bucket_size_mb = check_bucket_size_mb(bucket_size_mb)
        super().__init__(module, process_group=process_group)
        params = self.trainable
        self.plan = self.planner([p.numel() for p in params], [p.element_size() for p in params],
                                 bucket_size_mb=self.bucket_size_mb, keys=[(p.dtype, p.device) for p in params])
        self._bucket_buffers: list[torch.Tensor] = []
        self._views: list[torch.Tensor | None] = [None] * len(params)
        self._bucket_of = [0] * len(params)
        for k, b in enumerate(self.plan.buckets):
            ref = params[b.params[0]]
            buf = torch.zeros(b.numel + len(b.params), dtype=ref.dtype, device=ref.device)
            self._bucket_buffers.append(buf)
            for i, off in zip(b.params, b.offsets):
                self._views[i] = buf[off : off + params[i].numel()].view_as(params[i])
                self._bucket_of[i] = k
        self._present = [False] * len(params)  # logical "has a local gradient" (Note [Gradients as bucket views])
        self._reset_window()
        ref = weakref.ref(self)
        self._hooks = [p.register_post_accumulate_grad_hook(functools.partial(_hook, ref, i))
                       for i, p in enumerate(params)]

    def _reset_window(self) -> None:
        self._ready = [False] * len(self.trainable)
        self._pending = [len(b.params) for b in self.plan.buckets]
        self._works = [None] * len(self.plan.buckets)
        self._next = 0  # the first bucket not launched yet

    # -- views ---------------------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        if torch.is_grad_enabled():  # an eval forward must not give parameters zero gradients
            self._attach_views()
        return self.module(*args, **kwargs)

    def _attach_views(self) -> None:
        for k, b in enumerate(self.plan.buckets):
            if all(self.trainable[i].grad is None for i in b.params):
                self._bucket_buffers[k].zero_()  # one memset for the common case after zero_grad()
                for i in b.params:
                    self.trainable[i].grad = self._views[i]
                    self._present[i] = False
            else:
                for i in b.params:
                    self._adopt(i)

    def _adopt(self, i: int) -> None:
        """Make parameter i's slot hold its local gradient and ``.grad`` the slot's view."""
        p, view = self.trainable[i], self._views[i]
        g = p.grad
        if g is None:
            view.zero_()
            p.grad = view
            self._present[i] = False
        elif g is not view and not (g.data_ptr() == view.data_ptr() and g.shape == view.shape):
            view.copy_(g)
            p.grad = view
            self._present[i] = True

    # -- launching -----------------------------------------------------------------------------
    def _grad_ready(self, i: int) -> None:
        self._adopt(i)
        self._present[i] = True  # backward just produced a local gradient, even under no_sync
        if not self._sync_enabled:
            return  # Note [Hooks under no_sync]
        if self._ready[i]:
            raise RuntimeError(
                f"{type(self).__name__}: trainable parameter #{i} produced a gradient twice in one "
                f"synchronisation window: call finish_gradient_synchronization() after every synchronised "
                f"backward (or wrap the earlier ones in no_sync())")
        self._ready[i] = True
        k = self._bucket_of[i]
        self._pending[k] -= 1
        while self._next < len(self._bucket_buffers) and self._pending[self._next] == 0:
            self._launch(self._next)

    def _launch(self, k: int) -> None:
        b, buf = self.plan.buckets[k], self._bucket_buffers[k]
        for i in b.params:
            if not self._ready[i]:
                self._adopt(i)  # no hook this window: whatever local gradient there is, or zeros
        flags = buf[b.numel:]
        bits = [self._present[i] for i in b.params]
        if all(bits):
            flags.fill_(1)
        else:
            flags.copy_(torch.tensor(bits, dtype=buf.dtype))
        self._works[k] = self._reduce(k)
        self._next = k + 1

    def _reduce(self, k: int):
        if self.world_size == 1:
            return None
        return dist.all_reduce(self._bucket_buffers[k], group=self.process_group, async_op=True)

    def finish_gradient_synchronization(self) -> None:
        if not self._sync_enabled:
            return
        while self._next < len(self._bucket_buffers):
            self._launch(self._next)
        for k in range(len(self._bucket_buffers)):
            self._settle(k)
        self._reset_window()

    def _settle(self, k: int) -> None:
        """Wait for bucket k's all-reduce, average in place, apply its presence flags."""
        b, buf = self.plan.buckets[k], self._bucket_buffers[k]
        if self._works[k] is not None:
            self._works[k].wait()
        if self.world_size > 1:
            buf[: b.numel].div_(self.world_size)
        if all(self._present[i] for i in b.params):
            return  # Note [Presence flags in the bucket]: every count is >= 1, nothing to read
        for i, count in zip(b.params, buf[b.numel:].tolist()):
            if count == 0:
                self.trainable[i].grad = None  # no rank had a gradient
                self._present[i] = False
            else:
                self._present[i] = True
