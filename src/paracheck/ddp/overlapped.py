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
    no_sync micro-steps gets no hook then and is launched when that backward ends (Note [Several
    backward passes in one window]) or by ``finish_gradient_synchronization()``.

Note [Several backward passes in one window]
    The usual training loop calls ``backward()`` k times and ``finish_gradient_synchronization()``
    once; ``loss.backward(retain_graph=True); loss.backward()`` does the same without a forward in
    between. Each synchronised backward is one *round*: when it ends (a callback queued on the
    autograd engine by the round's first hook, where torch DDP finalises its reducer too) every
    unit not launched yet is launched, in plan order, with the presence flags last, and the round
    is settled at once: wait for its handles, divide by W, apply its presence flags. Every rank
    thus issues exactly one all-reduce per unit per synchronised backward, whatever its hooks saw,
    so ranks whose rounds use different parameters still pair their collectives. The gradient is
    then the average of the rounds so far, identical on every rank; the next backward adds its
    local gradient to it, the next round's all-reduce gives W * avg + sum_r g_r, and dividing by
    W gives avg + avg(new): the average of the sums, the oracle's value up to rounding.
    ``finish_gradient_synchronization()`` then has nothing left to do, unless ``no_sync()`` was
    entered since the last round (its backward passes only accumulated) or no synchronised
    backward ran in the window: then it launches and settles one round itself. Counting
    ``no_sync()`` entries, not hooks, keeps that decision the same on every rank.
    On NCCL, waiting in the callback costs the host nothing (``wait()`` orders the compute stream
    after the collective); on gloo it blocks until communication ends, where
    ``finish_gradient_synchronization()`` would block anyway. Nothing runs per parameter beyond
    the one post-accumulate hook: the step is close to host-bound on GPUs (docs/measurements.md),
    and a hook per parameter before accumulation, which an earlier design used to find the round
    boundary, cost the overlapped DDP about a quarter of its step on two GPUs.
    Precondition: every synchronised backward reaches at least one trainable parameter on every
    rank (it queues the callback); a rank whose backward reaches none merges that round into the
    next and issues fewer collectives than its peers.
"""

from __future__ import annotations

import functools
import weakref

import torch
import torch.distributed as dist
from torch import nn

from paracheck.ddp._common import DDPBase, RoundsMixin, presence_flags, reducible_grad
from paracheck.ddp._launch import launch, uses_launcher

__all__ = ["OverlappedDDP"]


def _hook(ref: weakref.ref, k: int, param: torch.Tensor) -> None:
    # A weak reference: the hook lives on the parameter, which may outlive this wrapper.
    ddp = ref()
    if ddp is not None:
        ddp._grad_ready(k)


class OverlappedDDP(RoundsMixin, DDPBase):
    """Equal to the oracle (see NaiveDDP), with communication overlapped with backward.

    Launches one async all-reduce per trainable parameter, in reverse registration order (Note
    [Launch in plan order]), plus one all-reduce of presence flags at the end of each synchronised
    backward (Note [Gradients that exist on some ranks only]). Collectives every rank must call:
    the constructor, every synchronised ``backward()`` (its hooks launch collectives) and
    ``finish_gradient_synchronization()`` after the last backward of a window, before anything
    reads ``.grad``; any number of synchronised backward passes may precede it (Note [Several
    backward passes in one window]). With ``world_size == 1`` the collectives are skipped and the
    same bookkeeping runs.
    """

    def __init__(self, module: nn.Module, *, process_group=None):
        super().__init__(module, process_group=process_group)
        self._order = self.trainable[::-1]
        self._off_thread: bool | None = None
        self._reset_window()
        ref = weakref.ref(self)
        self._hooks = [
            p.register_post_accumulate_grad_hook(functools.partial(_hook, ref, k))
            for k, p in enumerate(self._order)
        ]

    def _reset_window(self) -> None:
        n = len(self._order)
        self._ready = [False] * n
        self._present = [False] * n  # did the local gradient exist when the unit was launched
        self._works: list = []
        self._next = 0  # the first unit of the plan not launched yet
        self._flags = None

    def _all_reduce(self, t: torch.Tensor):
        if self.world_size == 1:
            return None
        if self._off_thread is None:
            # Decided at the first launch: Note [Launching off the autograd thread].
            self._off_thread = uses_launcher(t, self.process_group)
        return launch(self._off_thread, dist.all_reduce, t, group=self.process_group, async_op=True)

    def _grad_ready(self, k: int) -> None:
        if not self._sync_enabled:
            return  # Note [Hooks under no_sync]
        self._open_round()
        if self._ready[k]:
            return  # launched in this round already
        self._ready[k] = True
        while self._next < len(self._order) and self._ready[self._next]:
            self._launch(self._next)

    def _launch(self, k: int) -> None:
        p = self._order[k]
        self._present[k] = reducible_grad(p)
        self._works.append(self._all_reduce(p.grad))
        self._next = k + 1

    def _launch_rest(self) -> None:
        """Launch what the round has not launched, then the presence flags (issued last on every
        rank, after every gradient: same order everywhere)."""
        while self._next < len(self._order):
            self._launch(self._next)
        absent = [k for k, present in enumerate(self._present) if not present]
        self._flags = presence_flags(
            len(self._order), absent, dtype=torch.float32, device=self._order[0].device
        )
        self._works.append(self._all_reduce(self._flags))

    def _average(self, p: torch.Tensor) -> None:
        if self.world_size > 1:
            p.grad.div_(self.world_size)

    def _settle(self) -> None:
        """Wait for the launched round, average, and apply its presence flags."""
        for work in self._works:
            if work is not None:
                work.wait()
        # Where every local gradient existed, every count is >= 1 and the flags need not be read
        # (reading them would block the host until communication ends).
        counts = None if all(self._present) else self._flags.tolist()
        for k, p in enumerate(self._order):
            if counts is not None and counts[k] == 0:
                p.grad = None  # no rank had a gradient: as in single-process training
            else:
                self._average(p)
        self._reset_window()

    def finish_gradient_synchronization(self) -> None:
        if not self._sync_enabled or not self._order:
            return
        self._finish_window()
