"""Jobs for the attached-mode tests: module-level functions the agents import by path."""

import os
import socket
import time

import torch
import torch.distributed as dist


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
