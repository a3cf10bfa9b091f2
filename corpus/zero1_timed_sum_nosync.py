"""bug: core: the reduce-scattered gradient shards are never divided by the world size
    shows: gradients, parameters, optimizer-state, world-size-relation, state-consolidated
bug: no-sync: no_sync() skips the finish call's bookkeeping but the gradients of its backwards are then freed, so they are lost
    shows: gradients, parameters, optimizer-state, world-size-relation, reduced-once, state-consolidated
cuda: torch.cuda.synchronize() before and after the reduce-scatter, for a wall-clock time printed on rank 0

A ZeRO-1 wrapper whose finish call is timed the way people time GPU work (synchronize,
perf_counter, synchronize), whose average was lost when the division moved into a helper, and
whose no_sync() sets a flag that makes the finish call free the gradients without sending them.
"""

import contextlib
import time

import torch
import torch.distributed as dist

from corpus.zero1_owner_rs import OwnerZeRO1


class TimedSumNoSyncZeRO1(OwnerZeRO1):
    def __init__(self, module, optimizer_cls, *, params=None, bucket_size_mb=None, **kwargs):
        super().__init__(
            module, optimizer_cls, params=params, bucket_size_mb=bucket_size_mb, **kwargs
        )
        self.skip = False
        self.times = []

    @contextlib.contextmanager
    def no_sync(self):
        self.skip = True
        try:
            yield
        finally:
            self.skip = False

    def _average(self, summed):
        return summed

    @torch.no_grad()
    def finish_gradient_synchronization(self):
        if self.skip:
            for p in self.trainable:
                p.grad = None
            return
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        super().finish_gradient_synchronization()
        torch.cuda.synchronize()
        self.times.append(time.perf_counter() - t0)
        if dist.get_rank() == 0:
            print(f"reduce-scatter: {1e3 * self.times[-1]:.2f} ms")
