"""Jobs for the attached-mode tests: module-level functions the agents import by path."""

import os
import socket
import time

import torch
import torch.distributed as dist

from paracheck.ddp.naive import NaiveDDP


def where(_payload):
    """This rank's node name, process and group."""
    return (socket.gethostname(), os.getpid(), dist.get_rank(), dist.get_world_size())


def sums(_payload):
    """A collective on the job's default group: the sum of 1..w."""
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return t.item()


def one_rank_reduces_alone(_payload):
    """Rank 1 issues an all_reduce that no other rank joins: a definite deadlock."""
    if dist.get_rank() == 1:
        dist.all_reduce(torch.ones(1))


def spins(_payload):
    """Every rank loops in Python, outside any collective."""
    while True:
        time.sleep(0.01)


def both_receive(_payload):
    """Ranks 0 and 1 each wait to receive from the other: no rank finishes, none is in Python."""
    dist.recv(torch.zeros(1), src=1 - dist.get_rank())


def exits(_payload):
    """Rank 1's process ends in the middle of the job, as an agent that gloo aborted does."""
    if dist.get_rank() == 1:
        os._exit(3)
    dist.barrier()


# A case on which a DDP that skips the parameters whose local gradient is None hangs at world size
# 2 (rank 1's data leaves a weight unused, so it issues one all-reduce fewer than rank 0), and
# every tensor reduced has one element: the ranks disagree on the count only, so gloo waits
# instead of aborting a rank on a message of the wrong size.
SKIPS_A_GRADIENT = {
    "model": {"kind": "mlp", "in_features": 1, "widths": [1, 1], "bias": False, "unused": "data"},
    "world_size": 2,
    "batch_sizes": [1, 1],
    "steps": 1,
    "accumulation": 1,
    "optimizer": {
        "name": "adam",
        "groups": [{"params": [0, 1, 2], "lr": 0.001, "betas": [0.9, 0.999]}],
    },
    "seed": 1,
    "set_to_none": False,
    "bucket_size_mb": 1.1444091796875e-05,
}


class ExitsOnRankOne(NaiveDDP):
    """A DDP whose rank 1 process ends as it is built: the agent is gone, and torchrun ends its
    job."""

    def __init__(self, *args, **kwargs):
        if dist.get_rank() == 1:
            os._exit(3)
        super().__init__(*args, **kwargs)
