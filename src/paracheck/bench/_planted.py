"""Planted regressions for the measuring code's own tests: a benchmark property is only as good
as the regressions it catches. Not used by paracheck itself.

* ``FatFlatDDP``: FlatDDP plus one extra full-size gradient buffer, allocated at construction and
  kept (the classic "a copy of the gradients for later" change): exactly 4 bytes x trainable
  elements more at every memory point, no other quantity changes;
* ``ChattyFlatDDP``: FlatDDP that all-reduces its presence flags in a second collective: one
  collective more per step, the same payload plus the flags once more;
* ``RelaunchingFlatDDP``: FlatDDP that scales one gradient by 1.0 in place after synchronising:
  exactly one operator and one launch more per step, nothing else;
* ``HookedFlatDDP``: FlatDDP with a Python hook on every trainable parameter that does nothing:
  one hook call more per parameter and backward pass, nothing else;
* ``LeakyFlatDDP``: FlatDDP whose do-nothing hooks close over the wrapper: a cycle through the
  parameters' hook tables, which the garbage collector never frees, so the wrapper and its
  module outlive the job that built them (Note [Measuring from a clean state]);
* ``LateZero2``: Zero2 that waits for its reduce-scatters only at the end of backward: every
  bucket's full buffer lives until then, beside the shards (more than ZeRO-1 holds there).
* ``LateBucketedDDP``: BucketedDDP whose hooks only put each gradient in its bucket, so that
  ``finish_gradient_synchronization()`` launches every bucket: every all-reduce moves after
  backward (Note [Communication schedule of a step] in ``paracheck.accounting.schedule``);
* ``SyncingBucketedDDP``: BucketedDDP that reads one value of each bucket to the host after
  waiting for it: one device sync more per bucket, where the round is settled (the end of
  backward).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from paracheck.ddp.bucketed import BucketedDDP
from paracheck.ddp.flat import FlatDDP
from paracheck.zero.zero2 import Zero2

__all__ = [
    "ChattyFlatDDP",
    "FatFlatDDP",
    "HookedFlatDDP",
    "LeakyFlatDDP",
    "RelaunchingFlatDDP",
    "free_leaks",
    "LateBucketedDDP",
    "SyncingBucketedDDP",
]


class FatFlatDDP(FlatDDP):
    """FlatDDP with an extra float buffer the size of every trainable parameter together."""

    def __init__(self, module, *, process_group=None):
        super().__init__(module, process_group=process_group)
        ref = self.trainable[0]
        self.grad_copy = torch.zeros(
            sum(p.numel() for p in self.trainable), dtype=ref.dtype, device=ref.device
        )


class ChattyFlatDDP(FlatDDP):
    """FlatDDP plus one redundant all-reduce of the presence flags per synchronisation."""

    def finish_gradient_synchronization(self) -> None:
        if self.world_size > 1 and self._sync_enabled and self.trainable:
            flags = self._presence(self.trainable)
            dist.all_reduce(flags, group=self.process_group)
        super().finish_gradient_synchronization()


class RelaunchingFlatDDP(FlatDDP):
    """FlatDDP plus one redundant in-place multiply by 1.0 of the first gradient per synchronisation."""

    def finish_gradient_synchronization(self) -> None:
        super().finish_gradient_synchronization()
        grad = self.trainable[0].grad if self.trainable else None
        if grad is not None:
            grad.mul_(1.0)


class HookedFlatDDP(FlatDDP):
    """FlatDDP with a do-nothing post-accumulate-grad hook on every trainable parameter."""

    def __init__(self, module, *, process_group=None):
        super().__init__(module, process_group=process_group)
        for p in self.trainable:
            p.register_post_accumulate_grad_hook(lambda p: None)


class LeakyFlatDDP(FlatDDP):
    """FlatDDP with a post-accumulate-grad hook on every trainable parameter that closes over
    the wrapper."""

    def __init__(self, module, *, process_group=None):
        super().__init__(module, process_group=process_group)
        self._leaks = [
            p.register_post_accumulate_grad_hook(lambda p: self._leaks and None)
            for p in self.trainable
        ]


def free_leaks(_payload=None) -> None:
    """World job: remove every ``LeakyFlatDDP``'s hooks, so the garbage collector frees it (a
    test that plants the leak leaves its ranks as it found them)."""
    import gc

    for obj in gc.get_objects():
        if isinstance(obj, LeakyFlatDDP):
            for handle in obj._leaks:
                handle.remove()
    gc.collect()


class LateZero2(Zero2):
    """Zero2 that waits for its reduce-scatters only in ``finish_gradient_synchronization()``:
    every bucket's full buffer lives to the end of backward (ZeRO-1's gradients, and the shards
    beside them), freed before the optimizer step."""

    IN_FLIGHT = 1 << 30


class LateBucketedDDP(BucketedDDP):
    """BucketedDDP whose gradient hooks launch nothing: every bucket is launched by
    ``finish_gradient_synchronization()``, after backward."""

    def _grad_ready(self, i: int) -> None:
        self._adopt(i)


class SyncingBucketedDDP(BucketedDDP):
    """BucketedDDP that reads the first element of what each launch reduced (a bucket, the
    presence flags) to the host once it has waited for it."""

    def _wait(self, k: int) -> None:
        super()._wait(k)
        if self._sent[k] is not None:
            self._sent[k].reshape(-1)[0].item()
