"""OverlappedDDP: one asynchronous all-reduce per parameter, launched from backward as soon as that
parameter's gradient is final, so communication overlaps the rest of backward. Diff with FlatDDP:
a post-accumulate-grad hook per parameter instead of one call after backward, one collective per
parameter instead of one flat buffer, and no copies (each ``.grad`` is reduced in place).

Note [Launch in plan order]
    Every rank must issue the same collectives in the same order. Hooks fire in backward order,
    and backward order depends on each rank's own graph: with a data-dependent branch a
    parameter's hook fires on one rank and never on another. So a hook only marks its parameter
    *ready*; launching follows a fixed plan (reverse registration order, the order backward
    usually produces gradients): the k-th unit of the plan is launched only once it and every
    unit before it are ready. A unit that never becomes ready on this rank holds back the ones
    after it until ``finish_gradient_synchronization()``, which launches whatever is left, in
    order, with zeros for a missing local gradient. Every rank thus issues the same sequence;
    only the moment of each launch differs. The price of a rank-dependent branch early in the
    plan is lost overlap on the ranks that skipped it, never a hang.

Note [Hooks under no_sync]
    Inside ``no_sync()`` a hook does nothing: backward only accumulates. The next synchronised
    backward's hooks launch the accumulated sums; a parameter whose gradient came only from the
    no_sync micro-steps gets no hook then and is launched by ``finish_gradient_synchronization()``.
    A hook that fires for a parameter already ready in the current window means a second
    synchronised backward without ``finish_gradient_synchronization()`` in between: its gradient
    may already be in flight, so that is refused loudly instead of silently lost.
"""

from __future__ import annotations

import functools
import weakref

import torch
import torch.distributed as dist
from torch import nn

from ._common import DDPBase

__all__ = ["OverlappedDDP"]


def _hook(ref: weakref.ref, k: int, param: torch.Tensor) -> None:
    # A weak reference: the hook lives on the parameter, which may outlive this wrapper.
    ddp = ref()
    if ddp is not None:
        ddp._grad_ready(k)


class OverlappedDDP(DDPBase):
    """Equal to the oracle (see NaiveDDP), with communication overlapped with backward.

    Launches one async all-reduce per trainable parameter, in reverse registration order (Note
    [Launch in plan order]), plus one all-reduce of presence flags at the end (Note [Gradients that
    exist on some ranks only]). Collectives every rank must call: the constructor, every
    synchronised ``backward()`` (its hooks launch collectives) and
    ``finish_gradient_synchronization()``, which must follow each synchronised backward before
    anything reads ``.grad``. With ``world_size == 1`` the collectives are skipped and the same
    bookkeeping runs.
    """

    def __init__(self, module: nn.Module, *, process_group=None):
        super().__init__(module, process_group=process_group)
        self._order = self.trainable[::-1]
        n = len(self._order)
        self._ready = [False] * n
        self._present = [False] * n  # did the local gradient exist when the unit was launched
        self._works: list = []
        self._next = 0  # the first unit of the plan not launched yet
        ref = weakref.ref(self)
        self._hooks = [p.register_post_accumulate_grad_hook(functools.partial(_hook, ref, k))
                       for k, p in enumerate(self._order)]

    def _all_reduce(self, t: torch.Tensor):
        if self.world_size == 1:
            return None
        return dist.all_reduce(t, group=self.process_group, async_op=True)

    def _grad_ready(self, k: int) -> None:
        if not self._sync_enabled:
            return  # Note [Hooks under no_sync]
        if self._ready[k]:
            raise RuntimeError(
                f"{type(self).__name__}: trainable parameter #{len(self._order) - 1 - k} produced a gradient "
                f"twice in one synchronisation window: call finish_gradient_synchronization() after every synchronised "
                f"backward (or wrap the earlier ones in no_sync())")
        self._ready[k] = True
        while self._next < len(self._order) and self._ready[self._next]:
            self._launch(self._next)

    def _launch(self, k: int) -> None:
        p = self._order[k]
        self._present[k] = p.grad is not None
        if p.grad is None:
            p.grad = torch.zeros_like(p)  # this rank contributes zeros; see the presence flags
        self._works.append(self._all_reduce(p.grad))
        self._next = k + 1

    def _average(self, p: torch.Tensor) -> None:
        if self.world_size > 1:
            p.grad.div_(self.world_size)

    def finish_gradient_synchronization(self) -> None:
        if not self._sync_enabled or not self._order:
            return
        while self._next < len(self._order):
            self._launch(self._next)
        flags = torch.tensor(self._present, dtype=torch.float32, device=self._order[0].device)
        # Issued last on every rank, after every gradient: same order everywhere.
        flag_work = self._all_reduce(flags)
        for work in (*self._works, flag_work):
            if work is not None:
                work.wait()
        # Where every local gradient existed, every count is >= 1 and the flags need not be read
        # (reading them would block the host until communication ends).
        counts = None if all(self._present) else flags.tolist()
        for k, p in enumerate(self._order):
            if counts is not None and counts[k] == 0:
                p.grad = None  # no rank had a gradient: as in single-process training
            else:
                self._average(p)
        self._ready = [False] * len(self._order)
        self._works = []
        self._next = 0
