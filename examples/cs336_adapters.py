"""A CS336-style ``adapters.py`` that ``paracheck check --adapters`` checks design by design.

Run from the repository root::

    paracheck check --adapters examples/cs336_adapters.py --world-sizes 1,2,3

The earlier handouts' designs are paracheck's own components; the 2026 handout's ``get_ddp`` is
written out plainly (one flat all-reduce after backward), as a student would.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from paracheck.ddp import BucketedDDP, OverlappedDDP
from paracheck.zero import ShardedOptimizer


class PlainDDP(torch.nn.Module):
    """Broadcasts rank 0's parameters and buffers at construction; ``all_reduce_grads()`` leaves
    every trainable parameter's gradient the average over ranks (None where no rank has one)."""

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t.data, src=0)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def all_reduce_grads(self) -> None:
        params = [p for p in self.module.parameters() if p.requires_grad]
        if self.world_size == 1 or not params:
            return
        # One flat all-reduce of every gradient (zeros where this rank has none) and, after them,
        # one presence flag per parameter: a gradient no rank produced stays None.
        flat = torch.cat(
            [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
            + [torch.tensor([p.grad is not None for p in params], dtype=params[0].dtype)]
        )
        dist.all_reduce(flat)
        offset = 0
        flags = flat[-len(params) :].tolist()
        for p, present in zip(params, flags):
            g = flat[offset : offset + p.numel()].view_as(p) / self.world_size
            offset += p.numel()
            p.grad = g.to(p.dtype, copy=True) if present else None  # a float32 layer gets float32


# 2026 handout
def get_ddp(module: torch.nn.Module) -> torch.nn.Module:
    return PlainDDP(module)


def ddp_on_after_backward(ddp_model: torch.nn.Module, optimizer: torch.optim.Optimizer):
    ddp_model.all_reduce_grads()


# Earlier handouts
def get_ddp_individual_parameters(module: torch.nn.Module) -> torch.nn.Module:
    return OverlappedDDP(module)


def ddp_individual_parameters_on_after_backward(
    ddp_model: torch.nn.Module, optimizer: torch.optim.Optimizer
):
    ddp_model.finish_gradient_synchronization()


def get_ddp_bucketed(module: torch.nn.Module, bucket_size_mb: float) -> torch.nn.Module:
    return BucketedDDP(module, bucket_size_mb)


def ddp_bucketed_on_after_backward(ddp_model: torch.nn.Module, optimizer: torch.optim.Optimizer):
    ddp_model.finish_gradient_synchronization()


def ddp_bucketed_on_train_batch_start(ddp_model: torch.nn.Module, optimizer: torch.optim.Optimizer):
    pass  # BucketedDDP needs nothing before a batch


def get_sharded_optimizer(
    params, optimizer_cls: type[torch.optim.Optimizer], **kwargs
) -> torch.optim.Optimizer:
    return ShardedOptimizer(params, optimizer_cls, **kwargs)
