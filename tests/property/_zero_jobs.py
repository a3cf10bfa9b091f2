"""Rank jobs for the ZeRO tests: the gradient storage a rank holds after a step."""

import torch
import torch.distributed as dist
from torch import nn

from paracheck.zero import Zero1, Zero2


def gradient_bytes(_payload):
    """For Zero1 and Zero2 over the same float64 MLP (weights of 35, 20 and 12 elements, biases
    of 5, 4 and 3; buckets of at most 24 elements): (class name, gradient bytes held after two
    synchronised backward passes and a step, each bucket's padded size, parameters left with a
    .grad)."""
    out = []
    for cls in (Zero1, Zero2):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(7, 5), nn.Tanh(), nn.Linear(5, 4), nn.Linear(4, 3)).double()
        zero = cls(model, torch.optim.SGD, bucket_size_mb=24 * 8 / 2**20, lr=0.1)
        g = torch.Generator().manual_seed(dist.get_rank())
        for _ in range(2):
            zero(torch.randn(3, 7, dtype=torch.float64, generator=g)).square().sum().backward()
            zero.finish_gradient_synchronization()
        zero.step()
        out.append(
            (
                cls.__name__,
                zero.gradient_bytes(),
                [b.padded for b in zero.layout.buckets],
                sum(p.grad is not None for p in model.parameters()),
            )
        )
    return out
