"""correct

The greedy-by-bytes sharded optimizer (corpus/sharded_greedy.py) with its step timed the way a
benchmark does: torch.cuda.synchronize() around the step only when CUDA is available,
time.perf_counter() for the wall time, printed on rank 0 every 50 steps.
"""

import time

import torch
import torch.distributed as dist

from corpus.sharded_greedy import GreedyShardedOptimizer


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class TimedGreedyShardedOptimizer(GreedyShardedOptimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        self.step_seconds = []
        super().__init__(params, optimizer_cls, **kwargs)

    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        _sync()
        t0 = time.perf_counter()
        loss = super().step(closure, **kwargs)
        _sync()
        self.step_seconds.append(time.perf_counter() - t0)
        if dist.get_rank() == 0 and len(self.step_seconds) % 50 == 0:
            print(f"sharded step: {1e3 * self.step_seconds[-1]:.2f} ms")
        return loss
