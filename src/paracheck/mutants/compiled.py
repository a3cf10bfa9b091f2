"""Broken DDP variants that differ from a correct one only under ``torch.compile`` (Note [Compiled
cases] in ``paracheck.cases._compile``): each is the correct ``OverlappedDDP`` with one step
changed (marked ``BUG``), each behind a branch on ``torch.compiler.is_compiling()``, the way code
is kept out of Dynamo's graph to avoid a graph break. Eagerly they are ``OverlappedDDP``; compiled,
their values stay right (averaging is linear) and only the collective ledger tells (Note [A sync
compiled away] in ``paracheck.check.properties.compiled``)."""

from __future__ import annotations

import functools
import weakref

import torch

from paracheck.ddp.overlapped import OverlappedDDP, _hook

__all__ = ["HooksCompiledAwayDDP", "SyncedWhenCompiledDDP"]


class HooksCompiledAwayDDP(OverlappedDDP):
    """``OverlappedDDP`` registering its gradient hooks at its first forward, in a branch Dynamo
    folds away: compiled, no hook ever fires, and ``finish_gradient_synchronization()`` reduces
    every gradient after backward (same values, the overlap with backward gone)."""

    def __init__(self, module, *, process_group=None):
        super().__init__(module, process_group=process_group)
        for handle in self._hooks:  # registered at the first forward instead
            handle.remove()
        self._hooks = []

    def forward(self, *args, **kwargs):
        # BUG: skipped while Dynamo traces the forward (meant to keep hook registration, a side
        # effect on the parameters, out of the graph), so a compiled wrapper never registers them.
        if not self._hooks and not torch.compiler.is_compiling():
            ref = weakref.ref(self)
            self._hooks = [
                p.register_post_accumulate_grad_hook(functools.partial(_hook, ref, k))
                for k, p in enumerate(self._order)
            ]
        return super().forward(*args, **kwargs)


class SyncedWhenCompiledDDP(OverlappedDDP):
    """``OverlappedDDP`` whose ``no_sync()`` is honoured only eagerly: its forward turns
    synchronisation back on when Dynamo traces it, so compiled accumulation all-reduces every
    micro-step (the same average, W - 1 extra all-reduces of every gradient per window)."""

    def forward(self, *args, **kwargs):
        # BUG: one graph for both settings of the flag, so the traced forward resets it (Dynamo
        # replays the assignment each time the compiled forward runs).
        if torch.compiler.is_compiling():
            self._sync_enabled = True
        return super().forward(*args, **kwargs)
