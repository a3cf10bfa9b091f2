"""Rank jobs and DDP targets for the hygiene tests: they leak memory, print outside a job, warn."""

import atexit
import os
import threading
import time
import warnings

import torch
import torch.distributed as dist

from paracheck.ddp import NaiveDDP, TorchDDP
from paracheck.world import set_step

KEPT: list = []  # what the leaking jobs and targets keep alive, for the life of the rank process
MB = 2**20
_AT_EXIT: list = []


def ok(_):
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return dist.get_world_size(), t.item()


def leak(payload):
    """Keep ``mb`` MB more alive at each of ``steps`` steps on the ranks ``on``."""
    mb, steps, on = payload
    for step in range(steps):
        set_step(step)
        if dist.get_rank() in on:
            KEPT.append(torch.ones(mb * MB // 8, dtype=torch.float64))
        dist.barrier()
    return len(KEPT)


def exit_on(rank):
    if dist.get_rank() == rank:
        os._exit(3)
    dist.barrier()


def print_later(_):
    """Print from a thread after the job has returned: output outside any job."""

    def later():
        time.sleep(0.3)
        os.write(2, f"late noise from rank {dist.get_rank()}\n".encode())

    threading.Thread(target=later).start()


def warn(_):
    warnings.warn("a warning from the job, in every case", stacklevel=1)


class NoisyDDP(TorchDDP):
    """torch's DDP (find_unused_parameters=True: torch warns when every parameter is used) that
    also warns from Python on every forward and prints when its rank process exits."""

    def __init__(self, module, *args, **kwargs):
        super().__init__(module, *args, **kwargs)
        if not _AT_EXIT:
            _AT_EXIT.append(atexit.register(print, "NOISE: printed by the rank at exit"))

    def forward(self, *args, **kwargs):
        warnings.warn("NOISE: a warning from forward", stacklevel=1)
        return super().forward(*args, **kwargs)


class NoisyWrongDDP(NoisyDDP):
    """NoisyDDP whose gradients come out doubled: fails at every world size."""

    def finish_gradient_synchronization(self) -> None:
        super().finish_gradient_synchronization()
        for p in self.module.parameters():
            if p.grad is not None:
                p.grad.mul_(2)


class LeakyDDP(NaiveDDP):
    """NaiveDDP that keeps a 200 MB tensor alive at every synchronisation."""

    def finish_gradient_synchronization(self) -> None:
        KEPT.append(torch.ones(200 * MB // 8, dtype=torch.float64))
        super().finish_gradient_synchronization()
