"""A correct DDP wrapper with no ``no_sync()``: its ``+no-sync`` row is not supported (without the
method, the rank program synchronises every micro-step, which is the accumulation row again)."""

import torch

from paracheck.ddp import FlatDDP


class NoSyncLessDDP(torch.nn.Module):
    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.ddp = FlatDDP(module)

    def forward(self, *args, **kwargs):
        return self.ddp(*args, **kwargs)

    def finish_gradient_synchronization(self) -> None:
        self.ddp.finish_gradient_synchronization()
